"""Every window figure is over the requests' span, through the whole chain from samples to what is logged.

A synthetic node whose every sampled value and counter runs at one rate inside the span and at another,
distinctly different, outside it (the client's connection set-up before the first send, the tail after
the last completion, both inside the load call, while the sampler runs). The real parts run on it: the
telemetry sampler with its counter readings, the CPU accounting and the role accounting, the replica
actor's ``begin_window``/``end_window`` (the plain class under Ray's decorator), the measurement sequence
and the summary. Fakes stand in only for the clock, the processes (``/proc`` readings), NVML, ``/metrics``
and the Ray calls. Each span-based metric of the TrialResult (what goes to MLflow) must be the in-span
value: GPU and CPU utilisation means, role CPU, run-queue wait, context switches, the foreign share of
the replica's cores and the server's token rate.
"""

from __future__ import annotations

from collections import namedtuple
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from fakes import Remote, TickClock, agentic_trial

from orchestrator.control.measure import Window, WindowSequence
from orchestrator.node import replica_actor as actors
from orchestrator.node.accounting import CoreAccounting, CoreReading, span_figures
from orchestrator.node.attribution import ProcDesc, ProcReading, RoleAccounting, Snapshot, ThreadReading, span_window
from orchestrator.node.restrict import Verification
from orchestrator.node.telemetry import MetricsSnapshot, TelemetrySampler, span_readings
from orchestrator.observe.summary import summarize_series
from orchestrator.values.results import TrialStatus
from orchestrator.values.wire import CoreGrant, ReplicaUp
from workloads.records import RequestRecord
from workloads.run_workload import WorkloadRun

NS = 1_000_000_000
TICK = 0.1  # the clock's step, and the host sampling period
COUNTER_EVERY = 5  # a counter reading every 5 ticks (2 Hz)
REPLICA, CLIENT = (0, 1), (2,)
# The span's ends fall between counter readings (every 0.5 s from the window's start), so the readings
# used cover less than the span and the figures must be scaled to it.
CONNECT_S, SPAN_S, TAIL_S = 3.2, 10.0, 2.1
CpuTimes = namedtuple("CpuTimes", "user nice system idle iowait irq softirq steal guest guest_nice")

# Rates per phase: "in" is the requests' span, "out" the rest of the window.
GPU = {"in": 90.0, "out": 10.0}  # percent
CORE_BUSY = {"in": 0.8, "out": 0.5}  # busy seconds per second of each replica core (= its utilisation / 100)
CLIENT_BUSY = {"in": 0.4, "out": 0.05}
PROCS = {  # pid: (parent, title, role)
    100: (1, "python -m vllm serve", "api_server"),
    103: (100, "VLLM::EngineCore", "engine_core"),
    104: (103, "VLLM::Worker", "gpu_worker"),
}
CPU = {"in": {100: 0.3, 103: 0.5, 104: 0.6}, "out": {100: 0.05, 103: 0.03, 104: 0.02}}  # CPU-s per s
RUNQ = {"in": {100: 0.2, 103: 0.4, 104: 0.1}, "out": {100: 0.0, 103: 0.01, 104: 0.0}}  # run-queue s per s
CTX = {"in": 200.0, "out": 4.0}  # voluntary switches per s, every thread
TOKENS = {"in": 500.0, "out": 0.0}  # generation tokens per s
THROTTLE = {"in": (10.0, 4.0, 0.3), "out": (10.0, 0.0, 0.0)}  # a quota's periods, throttled periods, throttled s per s

# What each metric must read: the in-span rates over the span.
FOREIGN_IN = (len(REPLICA) * CORE_BUSY["in"] - sum(CPU["in"].values())) / len(REPLICA)
EXPECTED = {
    "gpu0_util_mean": GPU["in"],
    "replica_cpu_util_mean": 100 * CORE_BUSY["in"],
    "client_cpu_util_mean": 100 * CLIENT_BUSY["in"],
    "cpu_s_api_server": CPU["in"][100] * SPAN_S,
    "cpu_s_engine_core": CPU["in"][103] * SPAN_S,
    "cpu_s_gpu_worker": CPU["in"][104] * SPAN_S,
    "cpu_s_per_req_engine_core": CPU["in"][103] * SPAN_S / 2,
    "replica_roles_cpu_s": sum(CPU["in"].values()) * SPAN_S,
    "runq_wait_s_api_server": RUNQ["in"][100] * SPAN_S,
    "runq_wait_s_engine_core": RUNQ["in"][103] * SPAN_S,
    "runq_wait_s_gpu_worker": RUNQ["in"][104] * SPAN_S,
    "ctx_vol_engine_core": CTX["in"] * SPAN_S,
    "replica_cores_busy_s": len(REPLICA) * CORE_BUSY["in"] * SPAN_S,
    "replica_tree_cpu_s": sum(CPU["in"].values()) * SPAN_S,
    "replica_cores_foreign_frac": FOREIGN_IN,
    "server_generation_tokens_per_s": TOKENS["in"],
    "cgroup_periods": THROTTLE["in"][0] * SPAN_S,
    "cgroup_throttled_periods": THROTTLE["in"][1] * SPAN_S,
    "cgroup_throttled_frac": THROTTLE["in"][1] / THROTTLE["in"][0],
    "cgroup_throttled_s": THROTTLE["in"][2] * SPAN_S,
}


class Node:
    """The synthetic node: cumulative counters that grow at the current phase's rates, tick by tick."""

    def __init__(self, clock: TickClock) -> None:
        self.clock = clock
        self.phase = "out"
        self.busy = {c: 0.0 for c in (*REPLICA, *CLIENT)}
        self.elapsed = 0.0
        self.cpu = {pid: 0.0 for pid in PROCS}
        self.runq = {pid: 0.0 for pid in PROCS}
        self.ctx = 0.0
        self.tokens = 0.0
        self.cgroup = [0.0, 0.0, 0.0]  # periods, throttled periods, throttled seconds
        clock.listeners.append(self.tick)  # first: the samplers then read the tick's counters

    def tick(self) -> None:
        p = self.phase
        self.elapsed += TICK
        for c in REPLICA:
            self.busy[c] += CORE_BUSY[p] * TICK
        for c in CLIENT:
            self.busy[c] += CLIENT_BUSY[p] * TICK
        for pid in PROCS:
            self.cpu[pid] += CPU[p][pid] * TICK
            self.runq[pid] += RUNQ[p][pid] * TICK
        self.ctx += CTX[p] * TICK
        self.tokens += TOKENS[p] * TICK
        self.cgroup = [total + rate * TICK for total, rate in zip(self.cgroup, THROTTLE[p])]

    # -- what psutil, /proc, NVML and /metrics would say -------------------------------------------
    def percpu(self) -> list[CpuTimes]:
        return [CpuTimes(self.busy[c], 0, 0, self.elapsed - self.busy[c], 0, 0, 0, 0, 0, 0)
                for c in sorted(self.busy)]

    def cpu_percent(self) -> list[float]:
        """Each core's busy percent over the tick that just ended (the phase it ran in)."""
        rate = {**{c: CORE_BUSY[self.phase] for c in REPLICA}, **{c: CLIENT_BUSY[self.phase] for c in CLIENT}}
        return [100.0 * rate[c] for c in sorted(rate)]

    def tree_cpu(self, pids: Any) -> float:
        return sum(self.cpu[p] for p in pids if p in self.cpu)

    def read_process(self, pid: int) -> ProcReading | None:
        if pid not in PROCS:
            return None
        ppid, title, _ = PROCS[pid]
        thread = ThreadReading(round(self.ctx), 0, round(self.runq[pid] * NS), round(self.cpu[pid] * NS))
        return ProcReading(ProcDesc(pid, ppid, title, (title,)), 10.0, self.cpu[pid], 0.0, 0.0, 0.0, {pid: thread})

    def cpu_stat(self) -> dict[str, int]:
        """The replica's cgroup ``cpu.stat`` under a quota (cgroup v2 names)."""
        periods, throttled, seconds = self.cgroup
        return {"nr_periods": round(periods), "nr_throttled": round(throttled), "throttled_usec": round(seconds * 1e6)}

    def scrape(self, base_url: str) -> MetricsSnapshot:
        return MetricsSnapshot(values={"vllm:generation_tokens_total": self.tokens}, taken_at=self.clock.now())


class Gpu:
    def __init__(self, node: Node) -> None:
        self.node = node

    def read(self) -> dict[int, dict[str, float]]:
        return {0: {"util": GPU[self.node.phase], "mem_gib": 20.0}}

    def close(self) -> None:
        pass


class FakeVllm:
    """The replica actor's server, as far as a window needs it."""

    pid = 100
    cores = frozenset(REPLICA)
    base_url = "http://127.0.0.1:1"
    profile_dir = None

    def alive(self) -> bool:
        return True

    def verify(self) -> Verification:
        return Verification(True, "affinity", "0-1", 3, 3)

    def __init__(self, node: Node) -> None:
        self.cpu_stat = node.cpu_stat


class Workload:
    """The workload actor: set-up, then inside the load call connection set-up, the requests, the tail."""

    def __init__(self, clock: TickClock, node: Node) -> None:
        self.clock, self.node = clock, node
        self.run: WorkloadRun | None = None

    def pin(self, cpus: list[int]) -> Verification:
        return self.verify()

    def verify(self) -> Verification:
        return Verification(True, "affinity", "2", 1, 1)

    def prepare(self, spec_json: str, tokenizer: str, trace: Any) -> int:
        self.clock.advance(2.0)
        return 2

    def load(self, base_url: str, model: str) -> WorkloadRun:
        self.clock.advance(CONNECT_S)  # phase "out": the client opens its connections
        self.node.phase = "in"
        start = int(self.clock.now() * NS)
        self.clock.advance(SPAN_S)
        end = int(self.clock.now() * NS)
        self.node.phase = "out"
        self.clock.advance(TAIL_S)  # the client closes, Ray returns, the driver calls end_window
        records = tuple(RequestRecord(
            request_id=f"s{i}:0", session_id=f"s{i}", turn=0, scheduled_ns=start, sent_ns=start,
            first_token_ns=start + NS // 2, token_ns=(start + NS // 2,), end_ns=end, prompt_tokens=100,
            completion_tokens=1, cached_tokens=0, client_prompt_tokens=100, tokenize_ns=0, status="ok")
            for i in range(2))
        self.run = WorkloadRun(records=records, client_cpu_s=0.1, wall_s=CONNECT_S + SPAN_S + TAIL_S, warnings=(),
                               client_cores=1, window_start_ns=start, window_end_ns=end)
        return self.run

    def finish(self) -> WorkloadRun:
        assert self.run is not None
        return self.run


def _trial() -> Any:
    return agentic_trial(name="span", cores=len(REPLICA))


@pytest.fixture
def chain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Run one window through the real chain on the synthetic node; returns (TrialResult, WindowFigures)."""
    clock = TickClock()
    node = Node(clock)

    def sampler(**kw: Any) -> TelemetrySampler:
        # The actor's own arguments (cores, counters), with the clock and the readers of the synthetic node;
        # no threads: the clock's ticks take the samples and, every COUNTER_EVERY ticks, a counter reading.
        s = TelemetrySampler(**{**kw, "hz": 0, "metrics_url": None, "counters_hz": 0, "clock": clock.now,
                                "cpu_percent": node.cpu_percent, "gpu_reader": Gpu(node)})
        ticks = [0]

        def on_tick() -> None:
            if s._t_stop is not None:
                return
            s.sample_now()
            ticks[0] += 1
            if ticks[0] % COUNTER_EVERY == 0:
                s.sample_counters_now()

        clock.listeners.append(on_tick)
        return s

    monkeypatch.setattr(actors, "TelemetrySampler", sampler)
    monkeypatch.setattr(actors, "CoreAccounting", partial(CoreAccounting, percpu=node.percpu, tree=node.tree_cpu,
                                                          clock=clock.now))
    monkeypatch.setattr(actors, "RoleAccounting", partial(RoleAccounting, reader=node.read_process))
    monkeypatch.setattr(actors, "tree_pids", lambda root: sorted(PROCS))
    monkeypatch.setattr(actors, "pin_process", lambda cpus: None)
    monkeypatch.setattr(actors, "reset_prefix_cache", lambda base_url: True)
    monkeypatch.setattr(actors, "scrape", node.scrape)

    trial = _trial()
    replica_cls = actors.ReplicaActor.__ray_actor_class__  # the plain class under @ray.remote
    replica = replica_cls(trial.model_dump_json(), str(tmp_path / "home" / "node" / "trials" / "t" / "attempt-1"))
    replica.replica = FakeVllm(node)
    ends: list[Any] = []
    end_window = replica.end_window
    replica.end_window = lambda *a: ends.append(end_window(*a)) or ends[-1]

    window = Window(trial=trial, tdir=tmp_path, replica=Remote(replica), workload=Remote(Workload(clock, node)),
                    up=ReplicaUp(base_url=FakeVllm.base_url, tokenizer_path="tok", params={}),
                    alloc=CoreGrant(replica=list(REPLICA), client=list(CLIENT), client_isolated=True, host={}),
                    gpu_ids=[0], trace=None, warmup=True)
    result = WindowSequence(window, get=lambda x: x).run({"window_on_start": 1}, [], 0.0)
    return result, ends[0]


def test_every_logged_window_figure_is_the_in_span_value(chain: Any) -> None:
    result, figures = chain
    assert result.status is TrialStatus.COMPLETED, result.message
    m = result.metrics
    # The node really did run otherwise outside the span: a figure over every sample is not the span's.
    every = summarize_series(figures.rows)
    assert abs(every["gpu0_util_mean"] - GPU["in"]) > 10
    wrong = {k: (m.get(k), v) for k, v in EXPECTED.items() if m.get(k) != pytest.approx(v, rel=1e-6, abs=1e-9)}
    assert not wrong, "metric: (logged, in-span) " + "; ".join(f"{k}: {a} != {b}" for k, (a, b) in wrong.items())
    assert m["window_span_s"] == pytest.approx(SPAN_S, abs=1e-3)
    assert m["telemetry_outside_span_s"] == pytest.approx(CONNECT_S + TAIL_S, abs=1e-3)
    assert m["accounting_s"] == pytest.approx(9.5, abs=1e-3)  # the counter readings used: 3.5 s to 13 s, inside the span


def test_span_readings_pick_the_readings_inside_else_those_around() -> None:
    times = [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
    assert span_readings(times, 0.7, 2.2) == (2, 4)  # inside: 1.0 .. 2.0
    assert span_readings(times, 1.0, 2.0) == (2, 4)  # on the bounds counts as inside
    assert span_readings(times, 1.1, 1.4) == (2, 3)  # shorter than a period: the readings around it
    assert span_readings(times, 1.1, 1.6) == (2, 4)  # one reading inside: the readings around it
    assert span_readings(times, -1.0, 9.0) == (0, 5)
    assert span_readings([0.0], 0.0, 1.0) is None and span_readings([], 0.0, 1.0) is None


def test_span_figures_scale_the_readings_to_the_span_and_divide_by_it() -> None:
    # Readings 8 s apart inside a 10 s span: the rates between them, over the 10 s, on 2 cores.
    out = span_figures(CoreReading(100.0, 50.0), CoreReading(112.8, 61.2), covered_s=8.0, span_s=10.0, ncores=2)
    assert out["replica_cores_busy_s"] == pytest.approx(16.0) and out["replica_tree_cpu_s"] == pytest.approx(14.0)
    assert out["replica_cores_foreign_cpu_s"] == pytest.approx(2.0)
    assert out["replica_cores_foreign_frac"] == pytest.approx(2.0 / (10.0 * 2))
    desc = ProcDesc(1, 0, "python", ("vllm",))
    a = Snapshot(100.0, {1: ProcReading(desc, 10.0, 4.0, 1.0, 0.0, 0.0, {1: ThreadReading(10, 2, 1 * NS, 5 * NS)})})
    b = Snapshot(108.0, {1: ProcReading(desc, 10.0, 8.0, 1.8, 0.0, 0.0, {1: ThreadReading(90, 10, 3 * NS, 9 * NS)})})
    w = span_window(a, b, 1, covered_s=8.0, span_s=10.0)
    api = w.roles["api_server"]
    assert (api.user_s, api.sys_s) == pytest.approx((5.0, 1.0)) and (api.ctx_vol, api.ctx_invol) == (100, 10)
    assert api.runq_wait_ns == int(2.5 * NS) and api.processes == 1 and api.threads == 1
    assert w.wall_s == 10.0 and w.thread_cpu_s[(1, 1)] == pytest.approx(5.0) and w.process_cpu_s[1] == pytest.approx(6.0)


def test_the_sampler_reads_the_counters_at_start_every_period_and_at_stop() -> None:
    clock = TickClock()
    value = iter(range(100))
    s = TelemetrySampler(hz=0, clock=clock.now, gpu_reader=False, cpu_percent=lambda: [],
                         counters=lambda: next(value), counters_hz=0)
    s.start()
    clock.advance(1.0)
    s.sample_counters_now()
    clock.advance(0.5)
    s.stop()
    s.stop()  # idempotent: no second last reading
    assert [(round(t, 6), v) for t, v in s.counter_readings] == [(0.0, 0), (1.0, 1), (1.5, 2)]
