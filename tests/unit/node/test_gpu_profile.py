"""GPU profile reducer on a constructed Chrome trace; the capture's HTTP sequence with fakes (no GPU needed)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from orchestrator.node.gpu_profile import GpuProfileCapture, profiler_args, reduce_trace, reduce_traces


def x(cat: str, name: str, ts: float, dur: float, **args: object) -> dict[str, object]:
    return {"ph": "X", "cat": cat, "name": name, "pid": args.pop("pid", 7), "tid": 1, "ts": ts, "dur": dur,
            "args": args}


def trace() -> dict[str, object]:
    """One device: a plain launch (correlation 1) and a graph launch (2) whose kernels run later."""
    return {"traceEvents": [
        x("cpu_op", "aten::mm", 80, 120),  # the capture spans 80..200 us
        x("cuda_runtime", "cudaLaunchKernel", 90, 5, correlation=1),
        x("cuda_runtime", "cudaGraphLaunch", 95, 8, correlation=2),
        x("cuda_runtime", "cudaMemcpyAsync", 96, 2, correlation=3),
        x("kernel", "gemm", 100, 20, correlation=1, device=0, pid=0),
        x("kernel", "attn", 130, 20, correlation=2, device=0, pid=0),
        x("gpu_memcpy", "Memcpy HtoD", 150, 10, correlation=3, device=0, pid=0),
        x("kernel", "norm", 165, 10, correlation=2, device=0, pid=0),
        {"ph": "s", "id": 1, "ts": 90, "cat": "ac2g"},  # flow events are ignored
        {"ph": "M", "name": "process_name", "args": {"name": "python"}},
    ]}


def test_busy_fraction_gaps_and_launch_latency() -> None:
    m = reduce_trace(trace())
    # Busy: [100,120] + [130,160] + [165,175] = 60 us of a 120 us capture; gaps 10 and 5 us.
    assert m["gpu_profile_busy_frac"] == pytest.approx(0.5) and m["gpu_profile_busy_frac_min"] == pytest.approx(0.5)
    assert m["gpu_profile_gap_us_p50"] == pytest.approx(7.5) and m["gpu_profile_gap_us_p99"] == pytest.approx(9.95)
    # Launch -> first kernel of the same correlation: 100-90 = 10 us, 130-95 = 35 us (the memcpy is no launch).
    assert m["gpu_profile_launch_us_p50"] == pytest.approx(22.5) and m["gpu_profile_launch_us_p90"] == pytest.approx(32.5)
    assert m["gpu_profile_kernels"] == 3 and m["gpu_profile_span_ms"] == pytest.approx(0.12)


def test_two_devices_average_and_the_least_busy_is_kept() -> None:
    other = {"traceEvents": [x("kernel", "k", 80, 12, correlation=9, device=1, pid=1)]}
    m = reduce_traces([trace(), other])
    assert m["gpu_profile_busy_frac"] == pytest.approx((0.5 + 0.1) / 2)
    assert m["gpu_profile_busy_frac_min"] == pytest.approx(0.1) and m["gpu_profile_kernels"] == 4


def test_a_trace_without_gpu_activity() -> None:
    m = reduce_trace({"traceEvents": [x("cpu_op", "aten::mm", 0, 50)]})
    assert m["gpu_profile_kernels"] == 0 and "gpu_profile_busy_frac" not in m
    assert reduce_trace({}) == {"gpu_profile_kernels": 0.0}


def test_profiler_args_name_an_absolute_folder(tmp_path: Path) -> None:
    flag, cfg = profiler_args(tmp_path / "traces")
    assert flag == "--profiler-config"
    assert json.loads(cfg)["torch_profiler_dir"] == str((tmp_path / "traces").resolve())


def test_capture_posts_start_then_stop_and_reduces_the_new_traces(tmp_path: Path) -> None:
    (tmp_path / "old.pt.trace.json").write_text(json.dumps({"traceEvents": [x("kernel", "k", 0, 1, device=0)]}))
    posted: list[str] = []

    def post(url: str, timeout: float) -> int:
        posted.append(url.rsplit("/", 1)[1])
        if url.endswith("/stop_profile"):  # the worker writes its trace when the profiler stops
            (tmp_path / "rank0.pt.trace.json.gz").write_bytes(gzip.compress(json.dumps(trace()).encode()))
            (tmp_path / "api.pt.trace.json.gz").write_bytes(gzip.compress(
                json.dumps({"traceEvents": [x("cpu_op", "x", 0, 1)]}).encode()))
        return 200

    cap = GpuProfileCapture("http://127.0.0.1:1", tmp_path, seconds=2, post=post, sleep=lambda s: None).start()
    metrics, params = cap.stop()
    assert posted == ["start_profile", "stop_profile"] and params == {"gpu_profile_status": "ok"}
    assert metrics["gpu_profile_busy_frac"] == pytest.approx(0.5) and metrics["gpu_profile_kernels"] == 3
    assert metrics["gpu_profile_bytes"] == sum(p.stat().st_size for p in tmp_path.glob("*.gz"))


def test_a_server_without_the_profiler_is_a_status_not_an_error(tmp_path: Path) -> None:
    import urllib.error

    def post(url: str, timeout: float) -> int:
        raise urllib.error.HTTPError(url, 404, "Not Found", None, None)  # type: ignore[arg-type]

    metrics, params = GpuProfileCapture("http://127.0.0.1:1", tmp_path, post=post, sleep=lambda s: None).start().stop()
    assert metrics == {} and params["gpu_profile_status"].startswith("HTTP 404")
