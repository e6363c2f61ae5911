"""Load generator scheduling in virtual time: exact send times, caps, think time, window cuts."""

from __future__ import annotations

import pytest

from workloads.loadgen import ClosedLoop, LoadGenerator, LoadResult, OpenLoop
from workloads.trace import Block, Session, Turn

S = 1_000_000_000


def render(blocks) -> str:
    return "".join(f"<{b.hash_id}:{b.tokens}>" for b in blocks)


def one_turn(sid: str, start_s: float | None, out: int = 5) -> Session:
    return Session(sid, (Turn(append=(Block(1, 10),), output_tokens=out),), start_s=start_s)


def multi_turn(sid: str, turns: int, *, think_s: float = 0.0, out: int = 3) -> Session:
    return Session(sid, tuple(Turn(append=(Block(k, 10 + k),), output_tokens=out, think_s=think_s if k else 0.0)
                              for k in range(turns)))


def run(virtual, fake_backend, sessions, strategy, *, window_s=100.0, timeout_s=10.0, drain_s=None,
        keep_prompts=False, **fake):
    holder = {}

    async def main(clock):
        backend = fake_backend(clock, **fake)
        holder["backend"] = backend
        result = await LoadGenerator(backend, strategy, render, clock=clock, keep_prompts=keep_prompts).run(
            sessions, window_s=window_s, timeout_s=timeout_s, drain_s=drain_s)
        return result

    result: LoadResult = virtual(main)
    return result, holder["backend"]


def test_open_loop_sends_at_trace_offsets(virtual, fake_backend) -> None:
    sessions = [one_turn("a", 0.0), one_turn("c", 2.5), one_turn("b", 1.0)]
    result, backend = run(virtual, fake_backend, sessions, OpenLoop(max_in_flight=10))
    start = result.start_ns
    assert [(r.session_id, r.scheduled_ns - start) for r in result.records] == [("a", 0), ("b", 1 * S), ("c", 2.5 * S)]
    assert all(r.sent_ns == r.scheduled_ns for r in result.records)  # no lag in virtual time
    assert all(r.status == "ok" for r in result.records)
    assert result.sessions_started == 3 and result.turns_unsent == 0 and result.slot_waits == 0
    assert [req.request_id for req, _ in backend.sent] == ["a:0", "b:0", "c:0"]


def test_open_loop_requires_arrival_times(virtual, fake_backend) -> None:
    with pytest.raises(ValueError, match="start_s"):
        run(virtual, fake_backend, [one_turn("a", None)], OpenLoop(max_in_flight=1))


def test_open_loop_cap_makes_lateness_visible(virtual, fake_backend) -> None:
    # Each request lasts 0.1 + 4 * 0.01 = 0.14 s; all three arrive at 0 with one slot.
    sessions = [one_turn(s, 0.0) for s in "abc"]
    result, backend = run(virtual, fake_backend, sessions, OpenLoop(max_in_flight=1))
    assert backend.max_in_flight == 1
    assert result.slot_waits == 2
    lags = sorted(r.sent_ns - r.scheduled_ns for r in result.records)
    assert lags == [0, 140_000_000, 280_000_000]  # kept its arrival time: the wait is lag


def test_closed_loop_concurrency_and_think_time(virtual, fake_backend) -> None:
    sessions = [multi_turn(f"s{i}", 3, think_s=2.0) for i in range(5)]
    result, backend = run(virtual, fake_backend, sessions, ClosedLoop(concurrency=2))
    assert len(result.records) == 15 and backend.max_in_flight == 2
    by_session: dict[str, list] = {}
    for r in result.records:
        by_session.setdefault(r.session_id, []).append(r)
    for recs in by_session.values():
        recs.sort(key=lambda r: r.turn)
        for prev, nxt in zip(recs, recs[1:]):
            assert nxt.scheduled_ns - prev.end_ns == 2 * S  # think time after the real answer
    # Sessions 2.. start exactly when s0/s1 finish (3 turns of 0.12 s + 2 x 2 s think).
    firsts = sorted(recs[0].scheduled_ns - result.start_ns for recs in by_session.values())
    assert firsts[:2] == [0, 0] and firsts[2] == 3 * 120_000_000 + 4 * S


def test_prompt_carries_real_answers(virtual, fake_backend) -> None:
    result, backend = run(virtual, fake_backend, [multi_turn("s", 3)], ClosedLoop(concurrency=1))
    prompts = [req.prompt for req, _ in backend.sent]
    assert prompts[0] == "<0:10>"
    assert prompts[1] == "<0:10>" + " a0" * 3 + "<1:11>"
    assert prompts[2] == prompts[1] + " a1" * 3 + "<2:12>"
    assert [req.planned_prompt_tokens for req, _ in backend.sent] == [10, 10 + 3 + 11, 10 + 3 + 11 + 3 + 12]


def test_kept_prompts_are_the_prompts_sent(virtual, fake_backend) -> None:
    sessions = [multi_turn("s", 3), multi_turn("t", 2), one_turn("u", None)]
    result, backend = run(virtual, fake_backend, sessions, ClosedLoop(concurrency=2), keep_prompts=True)
    assert len(result.contexts) == 3  # one string per session, not per request
    for req, _ in backend.sent:
        assert result.prompt(req.request_id) == req.prompt
    plain, _ = run(virtual, fake_backend, sessions, ClosedLoop(concurrency=2))
    assert plain.contexts == {} and plain.prompt_chars == {}


def test_window_stops_new_turns_and_sessions(virtual, fake_backend) -> None:
    sessions = [one_turn("early", 0.0), one_turn("late", 5.0), one_turn("later", 6.0)]
    result, _ = run(virtual, fake_backend, sessions, OpenLoop(max_in_flight=4), window_s=5.0)
    assert [r.session_id for r in result.records] == ["early"]
    assert result.sessions_unstarted == 2 and result.turns_unsent == 2

    closed = [multi_turn("s", 10, think_s=1.0)]
    result, _ = run(virtual, fake_backend, closed, ClosedLoop(concurrency=1), window_s=3.0)
    # Turns at 0, 1.12, 2.24; the 4th would be scheduled at 3.36 s, past the window.
    assert len(result.records) == 3 and result.turns_unsent == 7


def test_in_flight_request_runs_past_window_to_completion(virtual, fake_backend) -> None:
    result, _ = run(virtual, fake_backend, [one_turn("a", 0.0, out=100)], OpenLoop(max_in_flight=1),
                    window_s=0.5, timeout_s=10.0)
    (r,) = result.records
    assert r.status == "ok" and r.completion_tokens == 100
    assert r.end_ns - result.start_ns == pytest.approx(1.09 * S)  # finished after the 0.5 s window


def test_drain_cuts_in_flight_requests(virtual, fake_backend) -> None:
    result, _ = run(virtual, fake_backend, [one_turn("a", 0.0, out=100)], OpenLoop(max_in_flight=1),
                    window_s=0.5, drain_s=0.2)
    (r,) = result.records
    assert r.status == "cut" and r.end_ns - result.start_ns == 0.7 * S
    assert 0 < r.completion_tokens < 100


def test_deadline_gives_timeout(virtual, fake_backend) -> None:
    result, _ = run(virtual, fake_backend, [one_turn("a", 0.0, out=100)], OpenLoop(max_in_flight=1), timeout_s=0.3)
    (r,) = result.records
    assert r.status == "timeout" and r.end_ns - r.sent_ns == 0.3 * S


def test_failed_turn_ends_session(virtual, fake_backend) -> None:
    result, _ = run(virtual, fake_backend, [multi_turn("s", 5)], ClosedLoop(concurrency=1), fail_turns={1})
    assert [r.status for r in result.records] == ["ok", "error"]
    assert result.turns_unsent == 3


def test_backend_that_raises_still_yields_a_record(virtual, fake_backend) -> None:
    result, _ = run(virtual, fake_backend, [multi_turn("s", 3)], ClosedLoop(concurrency=1), raise_turns={0})
    (r,) = result.records
    assert r.status == "error" and "RuntimeError: boom" in r.error
    assert result.turns_unsent == 2


def test_strategies_validate_arguments() -> None:
    with pytest.raises(ValueError):
        OpenLoop(max_in_flight=0)
    with pytest.raises(ValueError):
        ClosedLoop(concurrency=0)
    with pytest.raises(ValueError, match="no turns"):
        Session("x", ())


def test_rendering_the_next_session_is_not_the_previous_ones_lag(virtual, fake_backend) -> None:
    # Rendering costs 1 ms of (virtual) client time. Each session of a closed loop is sent before
    # the next one is rendered, so the sessions started together at the window's start show no
    # lag; before, session i waited for the rendering of every later one (3, 2, 1, 0 ms here).
    holder = {}

    def costly_render(blocks) -> str:
        holder["clock"].ns += 1_000_000
        return render(blocks)

    async def main(clock):
        holder["clock"] = clock
        backend = fake_backend(clock)
        return await LoadGenerator(backend, ClosedLoop(concurrency=4), costly_render, clock=clock).run(
            [one_turn(f"s{i}", None) for i in range(4)], window_s=100.0, timeout_s=10.0)

    result: LoadResult = virtual(main)
    assert len(result.records) == 4
    assert [r.sent_ns - r.scheduled_ns for r in result.records] == [0, 0, 0, 0]
    assert [r.scheduled_ns - result.start_ns for r in result.records] == [1_000_000, 2_000_000, 3_000_000, 4_000_000]
