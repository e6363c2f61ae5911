"""The latency stand-in server (``benchmarks/standin.py``), run for real in a subprocess.

The project's own consumers are the oracle: ``workloads.client.StreamingClient`` for the
streams, ``orchestrator.node.telemetry`` for ``/metrics`` and ``orchestrator.infra.net`` for health and
the port. Small delays keep the file fast: start-up 0.2 s, TTFT 50 ms, 5 ms per token.
Only processes started here are signalled, by their pid.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.infra.net import free_port, http_ok, port_is_free
from orchestrator.node.telemetry import delta, parse_metrics
from workloads.client import StreamingClient
from workloads.protocols import Message, Request

pytestmark = [pytest.mark.timeout(60), pytest.mark.filterwarnings("error")]

ROOT = Path(__file__).resolve().parents[3]
MODEL = "standin-model"
STARTUP_S, TTFT_S, TPOT_S = 0.2, 0.050, 0.005


@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    base_url: str
    ready_line: str
    started_after_s: float
    stderr: Path


def spawn(tmp: Path, startup_s: float = STARTUP_S) -> tuple[subprocess.Popen, int, Path]:
    port = free_port()
    err = tmp / f"standin-{port}.log"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "standin.py"), "--host", "127.0.0.1", "--port", str(port),
           "--model", MODEL, "--startup-s", str(startup_s), "--ttft-ms", str(TTFT_S * 1e3),
           "--tpot-ms", str(TPOT_S * 1e3), "--max-model-len", "4096"]
    with open(err, "wb") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=fh, text=True)
    return proc, port, err


def start(tmp: Path) -> Server:
    t0 = time.monotonic()
    proc, port, err = spawn(tmp)
    base = f"http://127.0.0.1:{port}"
    deadline = t0 + 20
    while not http_ok(base + "/health", timeout_s=0.5):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            pytest.fail(f"stand-in did not become healthy (rc {proc.returncode}): {err.read_text()[-2000:]}")
        time.sleep(0.02)
    started_after = time.monotonic() - t0
    assert proc.stdout is not None
    return Server(proc, port, base, proc.stdout.readline().strip(), started_after, err)


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> int:
    """Signal the process we started (by pid) and reap it; kill it only if it ignores the signal."""
    try:
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
    finally:
        if proc.stdout is not None:
            proc.stdout.close()
    return proc.returncode


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    s = start(tmp_path_factory.mktemp("standin"))
    try:
        yield s
    finally:
        stop(s.proc)


def get(url: str, data: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def request(rid: str, prompt: str, max_tokens: int, messages: tuple[Message, ...] | None = None) -> Request:
    return Request(request_id=rid, session_id=rid, turn=0, prompt=prompt, max_tokens=max_tokens,
                   scheduled_ns=time.monotonic_ns(), timeout_s=10.0, cut_ns=None, planned_prompt_tokens=1,
                   messages=messages)


def send_all(base_url: str, requests: list[Request]):
    async def main():
        async with StreamingClient(base_url, MODEL, max_connections=len(requests)) as client:
            return await asyncio.gather(*(client.send(r) for r in requests))
    return asyncio.run(main())


def test_health_models_and_standin_markers(server: Server) -> None:
    assert server.ready_line == f"stand-in server (not vLLM) ready on {server.base_url}"
    assert server.started_after_s >= STARTUP_S
    status, headers, _ = get(server.base_url + "/health")
    assert status == 200 and headers.get("x-standin") == "1"
    status, headers, body = get(server.base_url + "/v1/models")
    models = json.loads(body)
    assert status == 200 and headers.get("x-standin") == "1"
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == [MODEL]
    assert "stand-in" in models["data"][0]["owned_by"] and models["data"][0]["max_model_len"] == 4096
    assert "stand-in" in server.stderr.read_text()


def test_streaming_client_sees_configured_ttft_and_token_counts(server: Server) -> None:
    prompt = "x" * 400  # estimated as 400 / 4 = 100 tokens
    chat = (Message(role="user", content="y" * 40),)  # 40 / 4 + 4 template tokens = 14
    reqs = [request("a", prompt, 12), request("b", prompt, 7), request("c", "", 5, messages=chat)]
    results = send_all(server.base_url, reqs)
    for req, (record, answer) in zip(reqs, results):
        assert record.status == "ok", record.error
        ttft_s = (record.first_token_ns - record.sent_ns) / 1e9
        print(f"{req.request_id}: configured ttft {TTFT_S * 1e3:.1f} ms, measured {ttft_s * 1e3:.1f} ms")
        assert ttft_s >= TTFT_S
        assert record.completion_tokens == req.max_tokens and len(record.token_ns) == req.max_tokens
        assert answer == " tok" * req.max_tokens
        # Token k is due TTFT + k * TPOT after the server got the request, which is after it was sent.
        assert (record.token_ns[-1] - record.sent_ns) / 1e9 >= TTFT_S + (req.max_tokens - 1) * TPOT_S
        assert record.cached_tokens == 0
    assert [r.prompt_tokens for r, _ in results] == [100, 100, 14]


def test_concurrent_requests_each_see_the_ttft_without_queueing(server: Server) -> None:
    n, max_tokens = 8, 10
    results = send_all(server.base_url, [request(f"q{i}", "hello", max_tokens) for i in range(n)])
    ttfts = [(r.first_token_ns - r.sent_ns) / 1e9 for r, _ in results]
    assert all(r.status == "ok" for r, _ in results)
    assert min(ttfts) >= TTFT_S
    # A server that served them one after another would give the last a TTFT of at least
    # 7 * (50 ms + 9 * 5 ms) + 50 ms = 715 ms.
    assert max(ttfts) < 0.6, ttfts


def test_non_streaming_and_refusals_are_shaped_as_vllm(server: Server) -> None:
    body = {"model": MODEL, "prompt": [1, 2, 3, 4, 5, 6], "max_tokens": 3}
    status, _, raw = get(server.base_url + "/v1/completions", json.dumps(body).encode())
    out = json.loads(raw)
    assert status == 200 and out["object"] == "text_completion"
    assert out["choices"][0]["text"] == " tok" * 3 and out["choices"][0]["finish_reason"] == "length"
    assert out["usage"] == {"prompt_tokens": 6, "completion_tokens": 3, "total_tokens": 9,
                            "prompt_tokens_details": {"cached_tokens": 0}}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 2,
            "max_tokens": 9}
    status, _, raw = get(server.base_url + "/v1/chat/completions", json.dumps(chat).encode())
    out = json.loads(raw)
    assert status == 200 and out["choices"][0]["message"] == {"role": "assistant", "content": " tok tok",
                                                              "tool_calls": []}
    assert out["usage"]["completion_tokens"] == 2  # max_completion_tokens wins, as in vLLM
    status, _, raw = get(server.base_url + "/v1/completions", json.dumps({**body, "model": "other"}).encode())
    assert status == 404 and json.loads(raw)["error"]["param"] == "model"
    status, _, raw = get(server.base_url + "/v1/completions", json.dumps({**body, "max_tokens": 4095}).encode())
    assert status == 400 and "maximum context length is 4096" in json.loads(raw)["error"]["message"]


def test_metrics_count_what_was_served(server: Server) -> None:
    _, _, raw = get(server.base_url + "/metrics")
    before = parse_metrics(raw.decode())
    results = send_all(server.base_url, [request("m1", "abcdefgh", 4), request("m2", "abcd", 6)])  # 2 + 1 tokens
    assert all(r.status == "ok" for r, _ in results)
    status, headers, raw = get(server.base_url + "/metrics")
    text = raw.decode()
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert "standin_info" in families and "vllm:prompt_tokens" in families
    after = parse_metrics(text)
    server_metrics = delta(before, after)
    assert server_metrics["server_prompt_tokens"] == 3
    assert server_metrics["server_generation_tokens"] == 10
    assert server_metrics["server_prefix_cache_queries"] == 3
    assert server_metrics["server_prefix_cache_hits"] == 0 and server_metrics["server_prefix_hit_rate"] == 0
    assert server_metrics["server_ttft_count"] == 2 and server_metrics["server_ttft_s_mean"] >= TTFT_S
    assert server_metrics["server_e2e_count"] == 2
    assert after.values["vllm:request_success_total"] - before.values.get("vllm:request_success_total", 0) == 2
    assert after.gauges() == {"server_num_requests_running": 0.0, "server_num_requests_waiting": 0.0}


def test_reset_prefix_cache_answers_as_vllm(server: Server) -> None:
    status, headers, raw = get(server.base_url + "/reset_prefix_cache", b"")
    assert status == 200 and json.loads(raw) == {"success": True} and headers.get("x-standin") == "1"


def test_sigterm_exits_zero_and_frees_the_port(tmp_path: Path) -> None:
    s = start(tmp_path)
    results = send_all(s.base_url, [request("t", "hi", 3)])
    assert results[0][0].status == "ok"
    assert stop(s.proc, signal.SIGTERM) == 0
    assert port_is_free(s.port)
    assert "stopping on a signal" in s.stderr.read_text()


def test_sigint_during_startup_exits_zero_without_binding(tmp_path: Path) -> None:
    proc, port, err = spawn(tmp_path, startup_s=30.0)
    try:
        deadline = time.monotonic() + 20
        while "starting" not in err.read_text():  # logged once the signal handlers are installed
            assert proc.poll() is None and time.monotonic() < deadline, err.read_text()
            time.sleep(0.02)
        assert port_is_free(port)  # still in the emulated start-up: nothing listens yet
    finally:
        rc = stop(proc, signal.SIGINT)
    assert rc == 0
    assert "stopped during its emulated start-up" in err.read_text()
