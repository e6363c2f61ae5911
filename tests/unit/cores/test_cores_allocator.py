"""CoreAllocator: disjoint sets, clear refusals, client isolation, NUMA preference (pure, fake topologies)."""

import random
import threading

import pytest

from orchestrator.node.cores import CannotFit, CoreAllocator, NodeTopology, thread_env


def test_disjoint_under_random_allocate_release() -> None:
    rng = random.Random(0)
    for n_cpus, nodes in ((2, 1), (16, 2), (64, 4), (13, 3)):
        alloc = CoreAllocator(NodeTopology.synthetic(n_cpus, nodes))
        live: dict[str, frozenset[int]] = {}
        for step in range(2000):
            if live and rng.random() < 0.45:
                owner = rng.choice(sorted(live))
                alloc.release(owner)
                alloc.release(owner)  # idempotent
                del live[owner]
            else:
                owner, n = f"o{step}", rng.randint(1, max(1, n_cpus // 3))
                try:
                    got = alloc.allocate(owner, n, prefer_numa=rng.choice([None, 0, nodes - 1]))
                except CannotFit:
                    assert n > len(alloc.free)
                    continue
                assert len(got) == n and got <= set(range(n_cpus))
                live[owner] = got
            sets = list(live.values())
            assert sum(map(len, sets)) == len(frozenset().union(*sets)) if sets else True
            assert alloc.held() == live
            assert alloc.free == frozenset(range(n_cpus)) - frozenset().union(*sets) if sets else True


def test_thread_safe_concurrent_owners() -> None:
    alloc = CoreAllocator(NodeTopology.synthetic(64, 2))
    got: dict[str, frozenset[int]] = {}

    def take(i: int) -> None:
        got[f"t{i}"] = alloc.allocate(f"t{i}", 2)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(frozenset().union(*got.values())) == 64


def test_cannot_fit_messages() -> None:
    alloc = CoreAllocator(NodeTopology.synthetic(8))
    with pytest.raises(CannotFit, match=r"wanted 9 cores, node has 8, free 8"):
        alloc.allocate("big", 9)
    alloc.allocate("a", 6)
    with pytest.raises(CannotFit, match=r"b: wanted 3 cores, node has 8, free 2"):
        alloc.allocate("b", 3)
    with pytest.raises(ValueError, match="already holds"):
        alloc.allocate("a", 1)
    with pytest.raises(ValueError):
        alloc.allocate("z", 0)


def test_core_zero_last_and_contiguous() -> None:
    alloc = CoreAllocator(NodeTopology.synthetic(8))
    a = alloc.allocate("a", 3)
    assert 0 not in a and max(a) - min(a) == 2
    b = alloc.allocate("b", 4)
    assert 0 not in b and max(b) - min(b) == 3
    assert alloc.allocate("c", 1) == {0}


def test_housekeeping_cores_last_as_the_node_says() -> None:
    """ORCH_HOUSEKEEPING_CPUS moves the cores handed out last: on 2 cores with core 1 the housekeeping
    one, the replica goes on core 0 and its client on core 1 (a second test lane on one machine)."""
    two = NodeTopology(cpus=(0, 1), housekeeping=frozenset({1}))
    got = CoreAllocator(two).allocate_trial("t", 1, 1, "prefer")
    assert (got.replica, got.client, got.client_isolated) == ({0}, {1}, True)
    alloc = CoreAllocator(NodeTopology(cpus=tuple(range(8)), housekeeping=frozenset({6, 7})))
    assert alloc.allocate("a", 6) == set(range(6))
    assert alloc.allocate("b", 1) == {6} and alloc.allocate("c", 1) == {7}


def test_housekeeping_cores_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert NodeTopology.detect().housekeeping == {0}
    monkeypatch.setenv("ORCH_HOUSEKEEPING_CPUS", "2-3")
    assert NodeTopology.detect().housekeeping == {2, 3}


def test_best_fit_run() -> None:
    alloc = CoreAllocator(NodeTopology.synthetic(12))
    for owner, n in (("a", 2), ("b", 3), ("c", 2)):
        alloc.allocate(owner, n)
    alloc.release("b")  # a hole of 3 in the middle and a tail run elsewhere
    hole = frozenset(range(12)) - frozenset().union(*alloc.held().values()) - {0}
    got = alloc.allocate("d", 3)
    assert got <= hole and max(got) - min(got) == 2


def test_prefer_numa() -> None:
    topo = NodeTopology.synthetic(16, 2, gpu_numa={0: 1})
    assert topo.numa == {0: tuple(range(8)), 1: tuple(range(8, 16))}
    alloc = CoreAllocator(topo)
    assert alloc.allocate("r1", 4, prefer_numa=1) <= set(range(8, 16))
    assert alloc.allocate("r2", 4, prefer_numa=1) <= set(range(8, 16))
    r3 = alloc.allocate("r3", 4, prefer_numa=1)  # node 1 full: the other node, not a split
    assert r3 <= set(range(1, 8))
    spill = alloc.allocate("r4", 4, prefer_numa=0)  # node 0 has 4 left incl. core 0
    assert spill == frozenset(range(8)) - r3


def test_spills_across_nodes_only_when_needed() -> None:
    alloc = CoreAllocator(NodeTopology.synthetic(8, 2))
    got = alloc.allocate("wide", 6, prefer_numa=1)
    assert set(range(4, 8)) <= got and len(got & set(range(4))) == 2 and 0 not in got


def test_trial_disjoint_client() -> None:
    alloc = CoreAllocator(NodeTopology.synthetic(8))
    a = alloc.allocate_trial("t1", 4, 1, "require")
    assert a.client_isolated and not (a.replica & a.client)
    b = alloc.allocate_trial("t2", 2, 1, "require")
    everyone = [a.replica, a.client, b.replica, b.client]
    assert len(frozenset().union(*everyone)) == sum(map(len, everyone))
    alloc.release("t1")
    assert set(alloc.held()) == {"t2/replica", "t2/client"}
    alloc.release("t2")
    alloc.release("t2")
    assert alloc.free == frozenset(range(8))


def test_two_core_node_prefer_shares_and_require_refuses() -> None:
    topo = NodeTopology.synthetic(2)
    alloc = CoreAllocator(topo)
    one = alloc.allocate_trial("small", 1, 1, "require")
    assert one.replica == {1} and one.client == {0} and one.client_isolated
    alloc.release("small")

    shared = alloc.allocate_trial("big", 2, 1, "prefer")
    assert shared.replica == {0, 1} and shared.client <= shared.replica and not shared.client_isolated
    assert shared.describe()["client_isolated"] == "false"
    alloc.release("big")
    assert alloc.free == {0, 1}

    with pytest.raises(CannotFit, match=r"client.*disjoint.*'require'"):
        alloc.allocate_trial("big", 2, 1, "require")
    assert alloc.free == {0, 1}  # the replica's cores were given back
    for iso in ("require", "prefer"):
        with pytest.raises(CannotFit, match="wanted 3 cores, node has 2"):
            alloc.allocate_trial("huge", 3, 1, iso)
        with pytest.raises(CannotFit, match="wanted 3 cores, node has 2"):
            alloc.allocate_trial("huge", 1, 3, iso)
    assert alloc.free == {0, 1}


def test_detect_is_this_process() -> None:
    import os

    topo = NodeTopology.detect()
    assert set(topo.cpus) == os.sched_getaffinity(0)
    assert frozenset(c for cs in topo.numa.values() for c in cs) == frozenset(topo.cpus)
    assert topo.cpu_model


def test_thread_env() -> None:
    assert thread_env(1) == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                             "RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    assert thread_env(8)["OMP_NUM_THREADS"] == "8" and thread_env(8)["TOKENIZERS_PARALLELISM"] == "true"
