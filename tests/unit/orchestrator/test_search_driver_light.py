"""What keeps a knee search light on the driver: TTFTs read off the records without a frame, and estimator pool
workers that end with a driver killed by SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from orchestrator.control.search import from_result
from orchestrator.observe.outbox import records_frame
from orchestrator.observe.report.tables import ttft_values
from orchestrator.plan.expand import expand
from orchestrator.plan.load import parse_spec
from orchestrator.values.results import TrialResult, TrialStatus
from workloads.records import RequestRecord


def _record(i: int, *, status: str = "ok", first: int | None = 0) -> RequestRecord:
    sent = 1_700_000_000_000_000_000 + i * 977_000_123
    ft = None if first is None else sent + first
    return RequestRecord(request_id=f"r{i}", session_id="s", turn=i, scheduled_ns=sent, sent_ns=sent,
                         first_token_ns=ft, token_ns=(), end_ns=sent + 10**9, prompt_tokens=1, completion_tokens=1,
                         cached_tokens=None, client_prompt_tokens=1, tokenize_ns=0, status=status)


def test_from_result_reads_the_ttfts_the_report_reads():
    trial = expand(parse_spec({"name": "x", "models": [{"name": "m", "shape": "tiny-llama"}],
                               "workloads": [{"name": "w", "kind": "agentic", "sessions": 1, "turns": 1}],
                               "grid": {"cores": [2]}})).trials[0]
    records = tuple([_record(i, first=123_456_789 + 7_919 * i * i) for i in range(200)]
                    + [_record(900, status="error"), _record(901, first=None), _record(902, status="timeout")])
    got = from_result(trial, TrialResult(trial.trial_id, TrialStatus.COMPLETED, records=records))
    want = tuple(float(x) for x in ttft_values(records_frame(records)))
    assert got.ttfts == want and len(want) == 200  # the same floats, bit for bit; failed requests left out
    assert from_result(trial, TrialResult(trial.trial_id, TrialStatus.COMPLETED, records=())).ttfts == ()


DRIVER = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from orchestrator.control.search import EstimatorPool
    if __name__ == "__main__":
        with EstimatorPool(workers=1) as pool:
            pool({1: [np.array([1.0, 2.0])], 2: [np.array([1.0, 1.5])]}, stat="p90", tolerance=0.1, level=0.9,
                 n_boot=10, seed=0)
            print("ready", flush=True)
            time.sleep(600)
""")


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                out.append(int(entry))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_pool_workers_end_when_the_driver_is_killed(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    driver = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        assert driver.stdout is not None and driver.stdout.readline().strip() == "ready"
        workers = _children(driver.pid)
        assert workers, "the pool started no process"
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(10)
        deadline = time.monotonic() + 20
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [w for w in workers if _alive(w)]
        assert not left, f"pool processes {left} outlived the driver"
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
        for w in _children(driver.pid):
            os.kill(w, signal.SIGKILL)
