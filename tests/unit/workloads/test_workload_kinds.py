"""The registry of workload kinds (``workloads.loaders.KINDS``): one entry per kind of the spec's union, and
everything that dispatches on a kind (loader, loop, in-flight count, file, text) reads it."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from workloads.loaders import KINDS, in_flight, kind_of, load_sessions, text_style, trace_path
from workloads.loadgen import ClosedLoop, OpenLoop
from workloads.run_workload import strategy_for
from workloads.spec import AgenticWorkload, AzureWorkload, MooncakeWorkload, RecordedWorkload, WorkloadSpec

AGENTIC = AgenticWorkload(name="a", sessions=2, turns=2, concurrency=3, text_style="code")
MOONCAKE = MooncakeWorkload(name="m", path=Path("t.jsonl"), max_in_flight=7)
AZURE = AzureWorkload(name="z", path=Path("t.csv"), max_in_flight=9)
RECORDED = RecordedWorkload(name="r", path=Path("s.jsonl"), concurrency=5)


def test_every_kind_of_the_spec_has_one_entry():
    union = typing.get_args(typing.get_args(WorkloadSpec)[0])
    assert {cls.model_fields["kind"].default: cls for cls in union} == {k: v.spec for k, v in KINDS.items()}


@pytest.mark.parametrize(("spec", "loop", "count", "path", "style"), [
    (AGENTIC, ClosedLoop, 3, None, "code"),
    (MOONCAKE, OpenLoop, 7, Path("t.jsonl"), "agent-mix"),
    (AZURE, OpenLoop, 9, Path("t.csv"), "agent-mix"),
    (RECORDED, ClosedLoop, 5, Path("s.jsonl"), "uniform"),
], ids=["agentic", "mooncake", "azure", "recorded"])
def test_what_each_kind_dispatches_to(spec, loop, count, path, style):
    strategy = strategy_for(spec)
    assert type(strategy) is loop and strategy.slots == count == in_flight(spec)
    assert trace_path(spec) == path and text_style(spec) == style


def test_an_unknown_kind_is_an_error_not_a_default():
    class Other:
        kind = "other"

    for call in (kind_of, in_flight, strategy_for, load_sessions):
        with pytest.raises(TypeError, match="unknown workload kind 'other'"):
            call(Other())
    # a spec that claims a kind it is not of
    fake = AGENTIC.model_copy()
    object.__setattr__(fake, "kind", "recorded")
    with pytest.raises(TypeError, match="unknown workload kind 'recorded'"):
        kind_of(fake)


def test_load_sessions_uses_the_kinds_loader():
    sessions = load_sessions(AGENTIC)
    assert len(sessions) == 2 and all(len(s.turns) == 2 for s in sessions)
