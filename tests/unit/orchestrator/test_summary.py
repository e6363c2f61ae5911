"""Pure parts of the trial summary: the server's special tokens from first turns, the cross-check ratios."""

import math

from orchestrator.observe.summary import crosscheck_metrics, replay_fidelity_of, special_tokens
from workloads.records import RequestRecord
from workloads.trace import Block, Session, Turn

MS = 1_000_000


def rec(rid: str, prompt: int, ttft_ms: float, sent_ms: float = 0.0, cached: int | None = 0) -> RequestRecord:
    sent = int(sent_ms * MS)
    first = sent + int(ttft_ms * MS)
    return RequestRecord(request_id=rid, session_id=rid.split(":")[0], turn=int(rid.split(":")[1]),
                         scheduled_ns=sent, sent_ns=sent, first_token_ns=first, token_ns=(first,), end_ns=first,
                         prompt_tokens=prompt, completion_tokens=1, cached_tokens=cached, client_prompt_tokens=prompt,
                         tokenize_ns=0, status="ok")


SESSIONS = [Session("a", (Turn(append=(Block(1, 64), Block(2, 32)), output_tokens=1),
                          Turn(append=(Block(3, 32),), output_tokens=1))),
            Session("b", (Turn(append=(Block(1, 64), Block(4, 32)), output_tokens=1),))]


def test_special_tokens_are_measured_on_first_turns() -> None:
    # The server counted one more token than the plan on each first turn (a BOS); a later turn
    # (whose answer may merge with what follows) does not vote.
    records = [rec("a:0", 97, 10), rec("b:0", 97, 10, sent_ms=1), rec("a:1", 200, 10, sent_ms=20)]
    assert special_tokens(SESSIONS, records) == 1
    assert special_tokens(SESSIONS, []) == 0


def test_replay_fidelity_sees_the_shared_prefix() -> None:
    # b shares a's first 64-token block (plus the BOS): with 32-token blocks, 64 of its 97 tokens hit.
    records = [rec("a:0", 97, 10), rec("b:0", 97, 10, sent_ms=20, cached=64)]
    fid = replay_fidelity_of(SESSIONS, records, 32, measured_hit_rate=64 / 194)
    assert math.isclose(fid.metrics["ideal_prefix_hit_rate"], 64 / 194)
    assert abs(fid.metrics["prefix_hit_gap_eviction"]) < 1e-9
    assert replay_fidelity_of(SESSIONS, records, None, 0.3) is None


def test_crosscheck_ratio_of_ok_bare_rows() -> None:
    harness = [rec(f"a:{i}", 10, ttft) for i, ttft in enumerate((100, 200, 300))]
    bare = [{"request_id": "a:0", "ttft_s": 0.1, "status": "ok"}, {"request_id": "a:1", "ttft_s": 0.2, "status": "ok"},
            {"request_id": "a:2", "ttft_s": 0.4, "status": "ok"}, {"request_id": "a:3", "ttft_s": 9.0, "status": "timeout"}]
    out = crosscheck_metrics(harness, bare)
    assert math.isclose(out["crosscheck_ttft_p50_ratio"], 1.0) and out["crosscheck_bare_count"] == 3
    assert out["crosscheck_ttft_p90_ratio"] < 1.0  # the bare client's tail was slower here


class _Run:
    """The part of a workloads.WorkloadRun that summarize_trial reads."""

    def __init__(self, records):
        self.records, self.client_cpu_s, self.wall_s = tuple(records), 0.5, 1.0


def timed(rid: str, sent_ms: float, ttft_ms: float, end_ms: float, tokens: int) -> RequestRecord:
    sent, first, end = int(sent_ms * MS), int((sent_ms + ttft_ms) * MS), int(end_ms * MS)
    return RequestRecord(request_id=rid, session_id=rid.split(":")[0], turn=int(rid.split(":")[1]),
                         scheduled_ns=sent, sent_ns=sent, first_token_ns=first, token_ns=(first, end), end_ns=end,
                         prompt_tokens=10, completion_tokens=tokens, cached_tokens=0, client_prompt_tokens=10,
                         tokenize_ns=0, status="ok")


# Over 1 s: a fast request, one slow to its first token, one slow per output token.
SLO_RECORDS = [timed("a:0", 0, 100, 500, 11), timed("b:0", 0, 900, 1000, 2), timed("c:0", 0, 100, 1000, 4)]


def test_goodput_counts_the_requests_within_the_slo() -> None:
    from orchestrator.observe.summary import summarize_trial
    from orchestrator.values.sweep_spec import SloSpec

    rows = [{"t": 1.0, "name": "server_num_requests_running", "value": 1.0},
            {"t": 2.0, "name": "server_num_requests_running", "value": 2.0}]
    plain = summarize_trial(_Run(SLO_RECORDS), {}, rows)
    assert "goodput_rps" not in plain and "slo_ttft_s" not in plain
    assert math.isclose(plain["server_num_requests_running_mean"], 1.5)
    # a:0 0.5 s, b:0 1.0 s, c:0 1.0 s outstanding over a 1 s span
    assert math.isclose(plain["client_in_flight_mean"], 2.5)
    ttft = summarize_trial(_Run(SLO_RECORDS), {}, [], slo=SloSpec(ttft_s=0.5))
    assert math.isclose(ttft["goodput_rps"], 2.0) and ttft["slo_ttft_s"] == 0.5 and "slo_tpot_s" not in ttft
    # c:0 takes 0.9 s for 3 tokens after its first (0.3 s each); a:0 0.04 s each; b:0 0.1 s
    both = summarize_trial(_Run(SLO_RECORDS), {}, [], slo=SloSpec(ttft_s=0.5, tpot_s=0.2))
    assert math.isclose(both["goodput_rps"], 1.0) and both["slo_tpot_s"] == 0.2


def test_in_flight_mean_without_a_span() -> None:
    from orchestrator.observe.summary import in_flight_mean

    assert in_flight_mean([]) is None
    assert in_flight_mean([timed("a:0", 5, 0, 5, 1)]) is None


def test_cross_check_is_comparable_only_under_equal_quiet_neighbours() -> None:
    from orchestrator.observe.summary import crosscheck_load, load_warnings

    quiet = crosscheck_load({"replica_cores_foreign_frac": 0.02}, {"replica_cores_foreign_frac": 0.04})
    assert quiet["crosscheck_comparable"] == 1.0 and abs(quiet["crosscheck_foreign_gap"] - 0.02) < 1e-12
    assert load_warnings({"replica_cores_foreign_frac": 0.02, **quiet}) == []
    # the figures of a shared 2-core machine: the neighbours moved between the two runs
    busy = crosscheck_load({"replica_cores_foreign_frac": 0.23}, {"replica_cores_foreign_frac": 0.76})
    assert busy["crosscheck_comparable"] == 0.0 and busy["crosscheck_bare_foreign_frac"] == 0.76
    lines = load_warnings({"replica_cores_foreign_frac": 0.23, **busy})
    assert len(lines) == 2 and "23%" in lines[0] and "76% during the bare run" in lines[1]
    # equal but heavy neighbours are not a clean comparison either
    assert crosscheck_load({"replica_cores_foreign_frac": 0.30},
                           {"replica_cores_foreign_frac": 0.31})["crosscheck_comparable"] == 0.0
    # no bare-run accounting: nothing claimed
    assert crosscheck_load({"replica_cores_foreign_frac": 0.3}, {}) == {}
