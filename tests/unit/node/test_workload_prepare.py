"""The workload actor builds a window's text once per workload and reuses it for the next windows of its lease."""

from __future__ import annotations

from orchestrator.node import workload_actor as actors
from workloads.spec import AgenticWorkload, TokenRange
from workloads.text import bundled_tokenizer_path


def _spec(sessions: int = 2) -> str:
    return AgenticWorkload(name="w", sessions=sessions, turns=2, system_prompt_tokens=64,
                           task_tokens=TokenRange(min=8, max=16), tool_output_tokens=TokenRange(min=16, max=32),
                           output_tokens=TokenRange(min=4, max=8)).model_dump_json()


def test_the_same_workload_reuses_its_text_and_another_is_built_again() -> None:
    actor = actors.WorkloadActor.__ray_actor_class__()  # the plain class under @ray.remote
    tok = str(bundled_tokenizer_path("qwen3"))
    assert actor.prepare(_spec(), tok) == 2
    first = actor._prepared
    rendered = [first.factory.render(t.append) for s in first.sessions for t in s.turns]
    first.factory.tokenizer.encode("a word cache entry")
    assert actor.prepare(_spec(), tok) == 2
    assert actor._prepared is first  # the next window of the lease: nothing built again
    assert [first.factory.render(t.append) for s in first.sessions for t in s.turns] == rendered
    assert len(rendered) == 4 and all(rendered)  # 2 sessions x 2 turns, each with text
    assert actor.prepare(_spec(sessions=3), tok) == 3 and actor._prepared is not first  # another workload
    assert actor.prepare(_spec(), tok) == 2 and actor._prepared is not first  # only the last one is kept
