"""GPU profile reducer on a constructed Chrome trace; the capture's HTTP sequence with fakes (no GPU needed)."""

from __future__ import annotations

import gzip
import json
import threading
import urllib.error
from pathlib import Path

import pytest

from orchestrator.node.gpu_profile import (
    GpuProfileCapture,
    no_gpu_status,
    parse_version,
    profiler_args,
    profiler_config,
    profiler_launch,
    reduce_trace,
    reduce_traces,
)


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
    flag, cfg = profiler_args(tmp_path / "traces", "0.32.0")
    assert flag == "--profiler-config"
    assert json.loads(cfg)["torch_profiler_dir"] == str((tmp_path / "traces").resolve())


def test_vllm_versions_are_read_from_release_dev_and_local_strings() -> None:
    assert parse_version("0.32.0") == (0, 32) and parse_version("0.32.0+cpu") == (0, 32)
    assert parse_version("0.28.1rc1.dev451+g1970f3ed4") == (0, 28) and parse_version("v0.9.2") == (0, 9)
    assert parse_version("unknown") is None and parse_version(None) is None


def test_the_config_keeps_the_capture_small_and_leaves_the_front_end_out_only_where_that_works(tmp_path: Path) -> None:
    new, old = profiler_config(tmp_path, "0.32.0"), profiler_config(tmp_path, "0.26.0")
    for cfg in (new, old):
        assert cfg["profiler"] == "torch" and cfg["torch_profiler_with_stack"] is False
        assert cfg["torch_profiler_record_shapes"] is False and cfg["torch_profiler_dump_cuda_time_total"] is False
        assert cfg["torch_profiler_use_gzip"] is True
    # Before 0.32 ignore_frontend=true breaks /start_profile (HTTP 500, AsyncLLM.profiler unset): not sent.
    assert new["ignore_frontend"] is True and "ignore_frontend" not in old
    assert "ignore_frontend" not in profiler_config(tmp_path, "unknown")


def test_launch_chooses_flags_or_the_old_environment_by_version(tmp_path: Path) -> None:
    args, env = profiler_launch(tmp_path, "0.26.0")
    assert args[0] == "--profiler-config" and env == {}
    assert profiler_launch(tmp_path, "0.32.0+cpu")[0] == profiler_args(tmp_path, "0.32.0")
    args, env = profiler_launch(tmp_path, "0.9.2")
    assert args == [] and env["VLLM_TORCH_PROFILER_DIR"] == str(tmp_path.resolve())
    assert profiler_launch(tmp_path, "unknown")[0][0] == "--profiler-config"  # what every release in use takes


def test_the_installed_version_is_used_when_none_is_given(tmp_path: Path) -> None:
    from orchestrator.node.hostfacts import vllm_version

    assert profiler_args(tmp_path) == profiler_args(tmp_path, vllm_version())


def test_engine_steps_are_counted_from_the_host_annotations() -> None:
    m = reduce_trace({"traceEvents": [x("user_annotation", "execute_context_0(0)_generation_1(1)", 0, 5),
                                      x("gpu_user_annotation", "execute_context_0(0)_generation_1(1)", 1, 4),
                                      x("user_annotation", "execute_context_1(300)_generation_0(0)", 6, 5),
                                      x("user_annotation", "something_else", 6, 5)]})
    assert m["gpu_profile_steps"] == 2 and m["gpu_profile_kernels"] == 0


def test_no_gpu_status_tells_a_cpu_only_server_from_an_idle_gpu() -> None:
    assert no_gpu_status([{"deviceProperties": []}]) == "no GPU activity in 1 trace file(s) (CPU-only server)"
    assert "ran no kernel" in no_gpu_status([{"deviceProperties": [{"id": 0}]}, {}])


def gz(path: Path, trace: dict[str, object]) -> None:
    path.write_bytes(gzip.compress(json.dumps(trace).encode()))


def capture(tmp_path: Path, post, **kw: object) -> GpuProfileCapture:
    return GpuProfileCapture("http://127.0.0.1:1", tmp_path, seconds=2, post=post, sleep=lambda s: None, **kw)


def test_capture_posts_start_then_stop_reduces_the_new_traces_and_deletes_them(tmp_path: Path) -> None:
    (tmp_path / "old.pt.trace.json").write_text(json.dumps({"traceEvents": [x("kernel", "k", 0, 1, device=0)]}))
    posted: list[str] = []
    written: list[int] = []

    def post(url: str, timeout: float) -> int:
        posted.append(url.rsplit("/", 1)[1])
        if url.endswith("/stop_profile"):  # the worker writes its trace when the profiler stops
            gz(tmp_path / "rank0.1.pt.trace.json.gz", trace())
            gz(tmp_path / "host_1.async_llm.2.pt.trace.json.gz", {"traceEvents": [x("cpu_op", "x", 0, 1)]})
            (tmp_path / "rank0.profiler_out.txt").write_text("table")
            written.append(sum(p.stat().st_size for p in tmp_path.glob("*.gz")))
        return 200

    metrics, params = capture(tmp_path, post).start().stop()
    assert posted == ["start_profile", "stop_profile"] and params == {"gpu_profile_status": "ok"}
    assert metrics["gpu_profile_busy_frac"] == pytest.approx(0.5) and metrics["gpu_profile_kernels"] == 3
    assert metrics["gpu_profile_bytes"] == written[0] and metrics["gpu_profile_files"] == 2
    assert {"gpu_profile_s", "gpu_profile_stop_s", "gpu_profile_wall_s"} <= set(metrics)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.pt.trace.json"]  # only what was there before


def test_kept_traces_stay(tmp_path: Path) -> None:
    def post(url: str, timeout: float) -> int:
        if url.endswith("/stop_profile"):
            gz(tmp_path / "rank0.1.pt.trace.json.gz", trace())
        return 200

    metrics, params = capture(tmp_path, post, keep=True).start().stop()
    assert params["gpu_profile_status"] == "ok" and (tmp_path / "rank0.1.pt.trace.json.gz").exists()


def test_a_cpu_only_server_gives_a_status_and_still_the_size(tmp_path: Path) -> None:
    def post(url: str, timeout: float) -> int:
        if url.endswith("/stop_profile"):
            gz(tmp_path / "rank0.1.pt.trace.json.gz", {"deviceProperties": [], "traceEvents": [
                x("cpu_op", "aten::mm", 0, 50), x("user_annotation", "execute_context_0(0)_generation_2(2)", 0, 60)]})
        return 200

    metrics, params = capture(tmp_path, post).start().stop()
    assert params["gpu_profile_status"] == "no GPU activity in 1 trace file(s) (CPU-only server)"
    assert metrics["gpu_profile_bytes"] > 0 and metrics["gpu_profile_files"] == 1
    assert metrics["gpu_profile_kernels"] == 0 and metrics["gpu_profile_steps"] == 1
    assert "gpu_profile_busy_frac" not in metrics and list(tmp_path.iterdir()) == []


def test_a_window_that_ends_before_the_delay_captures_nothing(tmp_path: Path) -> None:
    posted: list[str] = []
    cap = GpuProfileCapture("http://127.0.0.1:1", tmp_path, seconds=2, delay_s=30,
                            post=lambda url, t: posted.append(url) or 200).start()  # real waits: stop() cuts them
    metrics, params = cap.stop(timeout_s=5)
    assert posted == [] and metrics == {} and params["gpu_profile_status"].startswith("the window ended before")


def test_a_window_that_ends_during_the_capture_cuts_it_short(tmp_path: Path) -> None:
    started = threading.Event()

    def post(url: str, timeout: float) -> int:
        if url.endswith("/start_profile"):
            started.set()
        else:
            gz(tmp_path / "rank0.1.pt.trace.json.gz", trace())
        return 200

    cap = GpuProfileCapture("http://127.0.0.1:1", tmp_path, seconds=60, delay_s=0, post=post).start()
    assert started.wait(5)
    metrics, params = cap.stop(timeout_s=10)
    # cut short: less than the 60 s asked for (no bound on how fast this machine is)
    assert params["gpu_profile_status"].startswith("ok, cut short") and metrics["gpu_profile_s"] < 60
    assert metrics["gpu_profile_kernels"] == 3


def test_a_failure_after_the_start_still_stops_the_profiler(tmp_path: Path) -> None:
    posted: list[str] = []

    def post(url: str, timeout: float) -> int:
        posted.append(url.rsplit("/", 1)[1])
        if url.endswith("/stop_profile") and posted.count("stop_profile") == 1:
            raise TimeoutError("timed out")
        return 200

    metrics, params = capture(tmp_path, post).start().stop()
    assert params["gpu_profile_status"] == "capture failed: TimeoutError: timed out"
    assert posted == ["start_profile", "stop_profile"]  # the stop was tried once; a failed stop is not retried


def test_stop_is_idempotent(tmp_path: Path) -> None:
    cap = capture(tmp_path, lambda url, t: 200).start()
    first = cap.stop()
    assert cap.stop() is first and first[1]["gpu_profile_status"].startswith("no trace file")


def test_a_server_without_the_profiler_is_a_status_not_an_error(tmp_path: Path) -> None:
    def post(url: str, timeout: float) -> int:
        raise urllib.error.HTTPError(url, 404, "Not Found", None, None)  # type: ignore[arg-type]

    metrics, params = GpuProfileCapture("http://127.0.0.1:1", tmp_path, post=post, sleep=lambda s: None).start().stop()
    assert metrics == {} and params["gpu_profile_status"].startswith("HTTP 404")
    assert "profiler_launch" in params["gpu_profile_status"]


def test_other_http_errors_say_what_the_server_said(tmp_path: Path) -> None:
    import io

    def post(url: str, timeout: float) -> int:
        raise urllib.error.HTTPError(url, 409, "Conflict", None, io.BytesIO(b'{"error": "already active"}'))  # type: ignore[arg-type]

    _, params = GpuProfileCapture("http://127.0.0.1:1", tmp_path, post=post, sleep=lambda s: None).start().stop()
    assert params["gpu_profile_status"].startswith("HTTP 409") and "already running" in params["gpu_profile_status"]
    assert "already active" in params["gpu_profile_status"]
