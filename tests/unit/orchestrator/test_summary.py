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
