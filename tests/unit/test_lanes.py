"""`make test`'s lanes (tests/lanes.py): every test runs in exactly one lane (the launcher test in the whole-node
one), and the lanes' cores."""

from __future__ import annotations

import importlib.util
import sys
from itertools import product
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

_spec = importlib.util.spec_from_file_location("lanes", Path(__file__).resolve().parents[1] / "lanes.py")
lanes = sys.modules["lanes"] = importlib.util.module_from_spec(_spec)  # dataclasses look it up
_spec.loader.exec_module(lanes)


def _selects(marks: str, has: set[str]) -> bool:
    return Expression.compile(marks).evaluate(lambda name, **_: name in has)


@pytest.mark.parametrize("cpus,n", [([0, 1], 2), ([0, 1, 2, 3], 2), ([3], 2), ([0, 1], 1)])
def test_every_kind_of_test_runs_in_exactly_one_lane(cpus, n):
    plan = lanes.plan_lanes(cpus, n)
    for integration, whole_node, gpu in product((False, True), repeat=3):
        has = {m for m, on in (("integration", integration), ("whole_node", whole_node), ("gpu", gpu)) if on}
        picked = [lane.name for lane in plan if _selects(lane.marks, has)]
        assert len(picked) == 1, (has, picked)
    # the launcher test (cluster, whole_node) runs once, in the lane that sees every core
    launcher = [lane for lane in plan if _selects(lane.marks, {"integration", "whole_node", "cluster"})]
    assert len(launcher) == 1 and launcher[0].cpus == set(cpus)


def test_two_cores_make_two_lanes_whose_replicas_never_share_a_core():
    from orchestrator.node.cores import HOUSEKEEPING_ENV, CoreAllocator, NodeTopology, parse_cpulist

    node, one = lanes.plan_lanes([0, 1], 2)
    assert (node.name, node.cpus, one.name, one.cpus) == ("node", {0, 1}, "one-core", {0, 1})
    # whole-node integration tests and unit tests in the first; the other integration tests in the second
    assert _selects(node.marks, {"integration", "whole_node"}) and _selects(node.marks, set())
    assert _selects(one.marks, {"integration"})
    placed = []
    for lane in (node, one):  # the product's placement under each lane's housekeeping core
        topo = NodeTopology(cpus=(0, 1), housekeeping=parse_cpulist(lane.env[HOUSEKEEPING_ENV]))
        got = CoreAllocator(topo).allocate_trial("t", 1, 1, "prefer")
        placed.append(got.replica)
        assert got.client_isolated
    assert placed == [{1}, {0}]


def test_one_core_or_one_lane_is_one_ordinary_run():
    assert [(lane.name, lane.cpus) for lane in lanes.plan_lanes([5], 2)] == [("all", {5})]
    assert [(lane.name, lane.cpus) for lane in lanes.plan_lanes([0, 1], 1)] == [("all", {0, 1})]
    with pytest.raises(ValueError, match="--lanes"):
        lanes.plan_lanes([0, 1], 3)
