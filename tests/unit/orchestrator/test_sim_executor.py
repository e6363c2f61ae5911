"""The simulated executor: its virtual clock and draws alone, then the real controller and node book on it at 64
nodes (every trial ends exactly once, CANNOT_FIT at once, a lost node's trial retried elsewhere)."""

from __future__ import annotations

import random
import threading
from collections import Counter

import pytest

from orchestrator.control.controller import SweepController
from orchestrator.control.sim_executor import Durations, Fault, SimExecutor, VirtualClock, fleet
from orchestrator.plan.expand import expand
from orchestrator.plan.load import parse_spec
from orchestrator.values.callbacks import Callback
from orchestrator.values.results import ErrorKind

D = Durations(started=(100.0, 200.0), warm=(10.0,))


def plan(hardware=("H200",), start="fresh", cores=(1, 2, 4, 8), workloads=2, repeats=4, max_failures=2):
    return expand(parse_spec({
        "name": "sim", "models": [{"name": "m", "shape": "tiny-llama"}],
        "workloads": [{"name": f"w{i}", "kind": "agentic", "sessions": 1, "turns": 1} for i in range(workloads)],
        "grid": {"cores": list(cores), "hardware": list(hardware), "start": [start]},
        "repeats": repeats, "max_failures": max_failures}))


def test_clock_wakes_lanes_in_virtual_time_order_once_all_wait():
    clock = VirtualClock(lanes_expected=lambda: 3)
    woke: list[tuple[str, float]] = []

    def lane(name: str, at: float) -> None:
        clock.join()
        clock.sleep_until(at)
        woke.append((name, clock.now))
        clock.leave()

    threads = [threading.Thread(target=lane, args=(n, t)) for n, t in (("a", 30.0), ("b", 10.0), ("c", 20.0))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert woke == [("b", 10.0), ("c", 20.0), ("a", 30.0)]


def test_clock_waits_for_the_lanes_it_expects():
    clock = VirtualClock(lanes_expected=lambda: 2)
    clock.join()
    done = threading.Event()

    def first() -> None:
        clock.sleep_until(5.0)
        done.set()

    threading.Thread(target=first, daemon=True).start()
    assert not done.wait(0.2)  # one lane of two has joined: time does not move
    assert clock.now == 0.0
    clock.join()
    clock.leave()  # the second lane leaves at once: now every lane that is left waits
    assert done.wait(5)
    assert clock.now == 5.0


def test_durations_draw_from_their_pool_and_need_both():
    rng = random.Random(0)
    assert {D.draw(rng, warm=False) for _ in range(50)} == {100.0, 200.0}
    assert D.draw(rng, warm=True) == 10.0
    assert D.mean_trial_s(0.5) == pytest.approx(0.5 * 10 + 0.5 * 150)
    with pytest.raises(ValueError):
        Durations(started=(), warm=(1.0,))


class Ledger(Callback):
    def __init__(self) -> None:
        self.results: Counter[str] = Counter()

    def on_trial_result(self, trial, result) -> None:
        self.results[trial.trial_id] += 1


def run(p, nodes, **kw):
    ex = SimExecutor(nodes, D, plan=p, **kw)
    ledger = Ledger()
    c = SweepController(p, ex, observers=[ledger], max_concurrent=10 ** 6)
    ex.clock.lanes_expected = lambda: c.lanes_used
    results = c.run()
    return ex, c, ledger, results


def test_real_controller_on_64_nodes_ends_every_trial_once_fails_cannot_fit_at_once_and_retries_lost_nodes():
    p = plan(hardware=("H200", "H100", "B200"), workloads=8, repeats=2)  # 192 trials, 64 for B200
    nodes = fleet({"H200": 32, "H100": 32})
    faults = [Fault(50.0, "h200-0003", "node_lost"), Fault(60.0, "h200-0007", "raylet_died", 30.0)]
    ex, c, ledger, results = run(p, nodes, faults=faults)
    by_id = {r.trial_id: r for r in results}
    assert len(results) == len(by_id) == len(p.trials)  # one final result per trial
    assert sum(ledger.results.values()) == ex.stats.attempts  # every attempt's result written once
    cannot = [t for t in p.trials if t.hardware == "B200"]
    assert all(by_id[t.trial_id].error_kind is ErrorKind.CANNOT_FIT and c.trials[t.trial_id].attempts == 1
               for t in cannot)
    assert all(by_id[t.trial_id].ok for t in p.trials if t.hardware != "B200")
    retried = [t for t, n in ledger.results.items() if n > 1]
    assert ex.stats.node_died == 2 and len(retried) == 2
    for tid in retried:  # the retry ran on another node
        assert by_id[tid].params["node_id"] not in ("h200-0003", "h200-0007")
    assert "h200-0007-r60" in ex.stats.by_node  # the raylet came back as a new node and took trials
    assert ex.clock.now > 0


def test_repin_groups_start_once_then_run_warm_on_their_node():
    p = plan(start="repin", cores=(8, 4, 2, 1), workloads=4, repeats=1)  # 4 groups of 4
    ex, c, ledger, results = run(p, fleet({"H200": 4}))
    assert all(r.ok for r in results)
    warm = Counter(r.params["sim_warm"] for r in results)
    assert warm == {"False": 4, "True": 12}
    nodes_per_group = {tuple(sorted({r.params["node_id"] for r in results if r.trial_id in ids}))
                       for ids in ({t.trial_id for t in p.trials if t.workload.name == f"w{i}"} for i in range(4))}
    assert all(len(g) == 1 for g in nodes_per_group)
    assert ex.clock.now == pytest.approx(max(100.0, 200.0) + 3 * 10.0, abs=100.0)


def test_more_lanes_than_free_nodes_wait_in_virtual_time():
    p = plan(workloads=4, repeats=2)  # 32 fresh trials on 4 nodes: lanes = 4
    ex, c, ledger, results = run(p, fleet({"H200": 4}))
    assert all(r.ok for r in results)
    assert c.lanes_used == 4
    assert ex.stats.held_s == pytest.approx(sum(r.ended_at - r.started_at for r in results))
    assert ex.clock.now >= 8 * 100.0  # 8 trials a node, at least 100 s each


def window(trial, rng):
    """100 requests, TTFT 0.2 s from 4 cores up, 50% more per core below, lognormal noise (seeded per trial)."""
    from workloads.records import RequestRecord

    mean = 0.2 * (1 + 0.5 * max(0, 4 - trial.cores))
    out = []
    for i in range(100):
        x = mean * rng.lognormvariate(0.0, 0.1)
        out.append(RequestRecord(request_id=f"r{i}", session_id="s", turn=0, scheduled_ns=i * 10**9, sent_ns=i * 10**9,
                                 first_token_ns=i * 10**9 + int(x * 1e9), token_ns=(), end_ns=i * 10**9 + int(x * 1e9) + 1,
                                 prompt_tokens=1, completion_tokens=1, cached_tokens=None, client_prompt_tokens=1,
                                 tokenize_ns=0, status="ok"))
    return tuple(out)


def search_plan():
    return expand(parse_spec({
        "name": "sim-search", "models": [{"name": "m", "shape": "tiny-llama"}],
        "workloads": [{"name": f"w{i}", "kind": "agentic", "sessions": 1, "turns": 1} for i in range(2)],
        "grid": {"cores": [1, 2, 3, 4, 6, 8, 12], "start": ["repin"]}, "repeats": {"max": 3}, "search": "knee"}))


def test_a_knee_search_runs_its_configurations_side_by_side_and_decides_as_one_at_a_time():
    p = search_plan()
    side, c, _, results = run(p, fleet({"H200": 8}), records=window)
    assert c.lanes_used == 2 and side.stats.lanes == 2
    one = SimExecutor(fleet({"H200": 8}), D, plan=p, records=window)
    alone = SweepController(p, one, max_concurrent=1)  # one lane: the searches one after another
    one.clock.lanes_expected = lambda: alone.lanes_used
    sequential = alone.run()
    assert alone.lanes_used == 1
    assert sorted(r.trial_id for r in results) == sorted(r.trial_id for r in sequential)
    assert [(o.label, o.stop, o.trials, o.estimate.knee) for o in c.outcomes] == \
           [(o.label, o.stop, o.trials, o.estimate.knee) for o in alone.outcomes]
    assert [o.estimate.knee for o in c.outcomes] == [4, 4]
    assert ["w0" in o.label for o in c.outcomes] == [True, False]  # in the plan's order, however the lanes ended
    assert side.clock.now < 0.75 * one.clock.now  # two nodes at once, not one


@pytest.mark.parametrize("order", [("H200", "H100"), ("H100", "H200")])
def test_a_mixed_fleet_keeps_both_kinds_busy_whatever_kind_the_plan_lists_first(order):
    p = plan(hardware=order, workloads=4, repeats=2)  # 64 trials: every trial of the first kind is listed first
    nodes = fleet({"H200": 4, "H100": 4})
    ex, c, _, results = run(p, nodes)
    assert all(r.ok for r in results)
    assert c.lanes_used == 8  # 4 lanes a kind
    first_start = {hw: min(t0 for nid, t0, _ in ex.stats.holds if nid.startswith(hw.lower())) for hw in order}
    assert first_start == {"H200": 0.0, "H100": 0.0}, "a kind of node idled while trials of its kind were pending"
    # Until the last node of each kind is taken, every node of it is held: no free node idles.
    for hw in order:
        last = ex.stats.last_acquire[hw]
        idle = sum(last - sum(max(0.0, min(t1, last) - t0) for nid, t0, t1 in ex.stats.holds if nid == n.node_id)
                   for n in nodes if n.hardware == hw)
        assert idle == pytest.approx(0.0, abs=1e-6), f"{hw} nodes idled {idle:.0f} node-s with work pending"
    book = ex.book.stats
    assert book.wakeups <= book.releases  # a release wakes at most one lane (exclusive)
    assert book.inventory_reads == 2  # no fault: read once a kind, as the controller counted its lanes


def test_a_release_wakes_one_waiting_lane_not_every_one():
    p = plan(workloads=8, repeats=2, max_failures=0)  # 64 trials, one kind
    ex, c, _, results = run(p, fleet({"H200": 4}), faults=[Fault(50.0, "h200-0001", "raylet_died", 30.0)])
    book = ex.book.stats
    assert book.waits >= 1  # the node's lane waited for the raylet to come back ...
    assert book.wakeups <= book.releases + 1  # ... and each wake-up carried a node (the join handed one too)
    assert book.inventory_reads == 3  # the lanes counted, the node's loss, its return
