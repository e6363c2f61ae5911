"""The share of held time inside windows, on a constructed sweep whose answers are worked out by hand:

- ``a1``: node A, 1 GPU, held 0-300 s: start 0-200, warm-up 205-215, window 220-262, cross-check
  265-280, teardown 285-300; idle 5+5+3+5 = 18 s; share 42/300.
- ``a2``: node A too (packed, overlapping ``a1``), 1 GPU, held 100-250 s: one shared start 100-180,
  windows 185-215 and 218-238, teardown 240-250; idle 5+3+2 = 10 s; share 50/150.
- ``b1``: node B, 2 GPUs, a failed start 0-120, teardown 120-130: held, no window.
- ``c1``: a CPU-only trial, 0 GPUs and 4 cores, held 0-100 s: start 0-60, window 60-90, teardown 90-100.
"""

from __future__ import annotations

import pytest

from orchestrator.observe.time_use import (
    PHASES,
    LeaseTimeline,
    Span,
    between_leases,
    lease_share,
    phase_seconds,
    share_metrics,
    timeline_from_events,
    unit_shares,
)

A1 = timeline_from_events("a1", [("start", 0), ("ready", 200), ("warmup", 205), ("warmup_end", 215),
                                 ("window", 220), ("window_end", 262), ("crosscheck", 265), ("crosscheck_end", 280),
                                 ("stop", 285), ("stopped", 300)], gpus=1, cores=4, node="A")
A2 = timeline_from_events("a2", [("start", 100), ("ready", 180), ("window", 185), ("window_end", 215),
                                 ("window", 218), ("window_end", 238), ("stop", 240), ("stopped", 250)],
                          gpus=1, cores=4, node="A")
B1 = timeline_from_events("b1", [("start", 0), ("start_failed", 120), ("stop", 120), ("stopped", 130)],
                          gpus=2, cores=8, node="B")
C1 = timeline_from_events("c1", [("start", 0), ("ready", 60), ("window", 60), ("window_end", 90), ("stop", 90),
                                 ("stopped", 100)], gpus=0, cores=4, node="C")


def test_one_lease_by_phase() -> None:
    s = lease_share(A1)
    assert s.held_s == 300 and s.unit == "gpu" and s.weight == 1
    assert s.phases == {"starting": 200, "warmup": 10, "window": 42, "crosscheck": 15, "teardown": 15, "idle": 18}
    assert s.window_share == pytest.approx(42 / 300)


def test_shared_start_counts_every_window_on_it() -> None:
    s = lease_share(A2)
    assert s.phases == {"starting": 80, "warmup": 0, "window": 50, "crosscheck": 0, "teardown": 10, "idle": 10}
    assert s.window_share == pytest.approx(1 / 3)


def test_failed_start_is_held_with_no_window() -> None:
    s = lease_share(B1)
    assert s.held_s == 130 and s.phases["starting"] == 120 and s.phases["teardown"] == 10
    assert s.phases["window"] == 0 and s.window_share == 0


def test_sweep_is_gpu_weighted_and_overlapping_leases_each_count() -> None:
    shares = unit_shares([A1, A2, B1, C1])
    gpu = shares["gpu"]
    assert gpu.leases == 3 and gpu.held == 300 + 150 + 2 * 130
    assert gpu.phases == {"starting": 200 + 80 + 2 * 120, "warmup": 10, "window": 92, "crosscheck": 15,
                          "teardown": 15 + 10 + 2 * 10, "idle": 28}
    assert sum(gpu.phases.values()) == gpu.held
    assert gpu.window_share == pytest.approx(92 / 710)
    core = shares["core"]  # the CPU-only trial counts its cores, apart from the GPU figures
    assert core.leases == 1 and core.held == 400 and core.window_share == pytest.approx(0.3)


def test_share_metrics_are_labelled_by_unit() -> None:
    m = share_metrics(unit_shares([A1, A2, B1, C1]))
    assert m["gpu_held_s"] == 710 and m["gpu_window_s"] == 92 and m["gpu_window_share"] == round(92 / 710, 4)
    assert m["core_held_s"] == 400 and m["core_window_share"] == 0.3 and m["core_starting_s"] == 240
    assert set(m) == {f"{u}_{p}_s" for u in ("gpu", "core") for p in PHASES} | {
        "gpu_held_s", "core_held_s", "gpu_window_share", "core_window_share", "gpu_idle_in_other_s"}
    assert m["gpu_idle_in_other_s"] == m["gpu_idle_s"]  # no step events: all of it before any step


def test_overlapping_spans_count_once_by_priority_and_are_clipped() -> None:
    t = LeaseTimeline("x", 0, 50, gpus=1, spans=(Span("starting", -10, 10), Span("window", 10, 20),
                                                Span("crosscheck", 15, 25), Span("teardown", 40, 60)))
    assert phase_seconds(t) == {"starting": 10, "warmup": 0, "window": 10, "crosscheck": 5, "teardown": 10,
                                "idle": 15}


def test_open_phases_end_at_the_stop_and_held_time_can_start_earlier() -> None:
    t = timeline_from_events("y", [("start", 10), ("ready", 30), ("window", 30), ("stop", 70), ("stopped", 75)],
                             gpus=1, held_from=0)
    assert phase_seconds(t) == {"starting": 20, "warmup": 0, "window": 40, "crosscheck": 0, "teardown": 5,
                                "idle": 10}  # 0-10: the slot was reserved before the start was requested
    repin = timeline_from_events("z", [("start", 0), ("ready", 10), ("window", 10), ("window_end", 20),
                                       ("repin", 22), ("repinned", 23), ("window", 23), ("window_end", 33)], gpus=1)
    assert phase_seconds(repin)["starting"] == 11 and phase_seconds(repin)["window"] == 20


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown event"):
        timeline_from_events("q", [("start", 0), ("begin_window", 1)])
    with pytest.raises(ValueError, match="unknown phase"):
        Span("measuring", 0, 1)
    with pytest.raises(ValueError, match="before it starts"):
        Span("window", 2, 1)
    with pytest.raises(ValueError, match="before it is held"):
        LeaseTimeline("r", 5, 1)
    assert lease_share(LeaseTimeline("empty", 3, 3, gpus=1)).window_share is None


def test_time_use_lines_name_the_unit_and_the_phases() -> None:
    from orchestrator.observe.time_use import describe_time_use

    figures = {"gpu_held_s": 200.0, "gpu_window_s": 50.0, "gpu_starting_s": 120.0, "gpu_warmup_s": 10.0,
               "gpu_crosscheck_s": 0.0, "gpu_teardown_s": 10.0, "gpu_idle_s": 10.0, "gpu_window_share": 0.25}
    (line,) = describe_time_use(figures)
    assert line.startswith("GPU-held time: 200 GPU-s, 25.0% inside measurement windows")
    assert "starting 60.0%" in line and "idle 5.0%" in line
    assert describe_time_use({}) == []


def test_between_leases_counts_a_nodes_gaps_weighted_by_the_next_lease() -> None:
    a = LeaseTimeline("a", 0.0, 100.0, gpus=1, node="n1", spans=(Span("window", 60.0, 90.0),))
    b = LeaseTimeline("b", 104.0, 200.0, gpus=1, node="n1", spans=(Span("window", 150.0, 190.0),))
    c = LeaseTimeline("c", 210.0, 300.0, gpus=2, node="n1")  # 10 s gap, 2 GPUs waiting
    other = LeaseTimeline("o", 150.0, 160.0, gpus=1, node="n2")  # alone on its node: no gap
    packed = LeaseTimeline("p", 50.0, 120.0, gpus=1, node="n3")
    packed2 = LeaseTimeline("p2", 60.0, 130.0, gpus=1, node="n3")  # overlaps: no gap
    gaps = between_leases([c, a, b, other, packed, packed2])
    assert gaps == {"gpu": pytest.approx(4.0 + 20.0)}
    figures = share_metrics(unit_shares([a, b]), between_leases([a, b]))
    assert figures["gpu_between_leases_s"] == pytest.approx(4.0)
    assert figures["gpu_node_window_share"] == pytest.approx(70.0 / 200.0)
    from orchestrator.observe.time_use import describe_time_use

    assert "4 GPU-s more between leases" in describe_time_use(figures)[0]
    assert between_leases([]) == {}


def test_idle_time_is_split_by_the_step_it_was_spent_in() -> None:
    """A re-pinned pair of windows worked out by hand: held 0-100; start 0-20; idle 20-25 in ``prepare``
    (entered at 20), 25-26 in ``reset``; window 26-46; idle 46-50 in ``scrape`` (entered in the window at
    46), 50-53 in ``next`` (the hand-off), then the re-pin 53-55, idle 55-56 in ``reset``, window 56-76,
    idle 76-90 in ``scrape`` (the step started before the idle time does not move it), teardown 90-100."""
    from orchestrator.observe.time_use import describe_time_use, idle_seconds

    t = timeline_from_events("r", [("start", 0), ("ready", 20), ("step:prepare", 20), ("step:reset", 25),
                                   ("window", 26), ("step:scrape", 46), ("window_end", 46), ("step:next", 50),
                                   ("repin", 53), ("repinned", 55), ("step:reset", 55), ("window", 56),
                                   ("step:scrape", 70), ("window_end", 76), ("stop", 90), ("stopped", 100)],
                             gpus=1)
    assert idle_seconds(t) == pytest.approx({"prepare": 5.0, "reset": 2.0, "scrape": 18.0, "next": 3.0})
    assert sum(idle_seconds(t).values()) == pytest.approx(phase_seconds(t)["idle"])
    assert phase_seconds(t)["window"] == pytest.approx(40.0)  # steps cut the time, never move it
    before = LeaseTimeline("b", 0.0, 10.0, gpus=1, spans=(Span("window", 4.0, 8.0),), steps=(("reset", 6.0),))
    assert idle_seconds(before) == pytest.approx({"other": 4.0, "reset": 2.0})
    figures = share_metrics(unit_shares([t, before]))
    assert figures["gpu_idle_in_scrape_s"] == pytest.approx(18.0)
    assert figures["gpu_idle_in_other_s"] == pytest.approx(4.0)
    assert sum(v for k, v in figures.items() if k.startswith("gpu_idle_in_")) == pytest.approx(figures["gpu_idle_s"])
    lines = describe_time_use(figures)  # of 110 GPU-s held
    assert lines[1] == "  idle by step: scrape 16.4%, prepare 4.5%, other 3.6%, reset 3.6%, next 2.7%"
