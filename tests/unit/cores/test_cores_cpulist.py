"""Linux cpu-list text ⇄ core sets."""

import random

import pytest

from orchestrator.node.cores import format_cpulist, parse_cpulist


@pytest.mark.parametrize("text,cpus", [
    ("", set()), ("0", {0}), ("0-3", {0, 1, 2, 3}), ("0-3,8", {0, 1, 2, 3, 8}),
    ("1,3,5", {1, 3, 5}), (" 0-1 ,4-5\n", {0, 1, 4, 5}), ("7-7", {7}),
])
def test_parse(text: str, cpus: set[int]) -> None:
    assert parse_cpulist(text) == frozenset(cpus)


@pytest.mark.parametrize("cpus,text", [
    (set(), ""), ({0}, "0"), ({0, 1, 2, 3}, "0-3"), ({8, 0, 1, 2, 3}, "0-3,8"), ({1, 3, 5}, "1,3,5"),
    ({0, 1, 3, 4, 5, 9}, "0-1,3-5,9"),
])
def test_format(cpus: set[int], text: str) -> None:
    assert format_cpulist(cpus) == text


@pytest.mark.parametrize("bad", ["3-1", "a", "1-", "-1"])
def test_parse_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_cpulist(bad)


def test_round_trip_random() -> None:
    rng = random.Random(7)
    for _ in range(500):
        cpus = frozenset(rng.sample(range(256), rng.randint(0, 64)))
        assert parse_cpulist(format_cpulist(cpus)) == cpus
