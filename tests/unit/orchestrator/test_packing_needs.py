"""What a trial books on its node, by client isolation, and the allocator's ``share`` mode."""

from __future__ import annotations

from orchestrator.control.placement import Node, NodeBook
from orchestrator.control.ray_executor import need_of
from orchestrator.node.cores import CoreAllocator, NodeTopology
from orchestrator.plan.expand import expand
from orchestrator.plan.load import parse_spec


def _trial(isolation: str, cores: int = 2):
    return expand(parse_spec({
        "name": "n", "models": [{"name": "m", "shape": "tiny-llama"}],
        "workloads": [{"name": "w", "kind": "agentic", "sessions": 1, "turns": 1}],
        "grid": {"cores": [cores]}, "client": {"cores": 1, "isolation": isolation}})).trials[0]


def test_a_trial_books_its_client_cores_unless_it_shares_them():
    req, pref, share = (need_of(_trial(i)) for i in ("require", "prefer", "share"))
    assert (req.held, pref.held, share.held) == (3, 3, 2)
    small = Node("n", 2.0)
    assert not req.matches(small)  # a disjoint client core is required and there is none
    assert pref.matches(small) and share.matches(small)  # prefer may share on a small node, alone


def test_packing_counts_what_the_core_agent_will_hand_out():
    book = NodeBook(lambda: [Node("n", 4.0)], "packed")
    share = need_of(_trial("share", cores=2))
    assert book.acquire("a", share) == "n" and book.acquire("b", share) == "n"  # 2 + 2 cores
    assert book.capacity([share]) == 2
    prefer = need_of(_trial("prefer", cores=2))
    assert book.capacity([prefer]) == 1  # 2 + 1 client: one per 4-core node


def test_share_puts_the_client_on_the_replicas_own_cores():
    alloc = CoreAllocator(NodeTopology.synthetic(4))
    a = alloc.allocate_trial("t1", 2, 1, "share")
    b = alloc.allocate_trial("t2", 2, 1, "share")
    assert a.client <= a.replica and b.client <= b.replica and not a.client_isolated
    assert not (a.replica & b.replica) and alloc.free == frozenset()
