"""The chat endpoint's own cost: the same conversations sent as chat and as completions, from one client.

Why: on the H200 at 1 core, ``vllm bench serve`` (which replays chat requests through
``/v1/completions`` with the chat template rendered client-side) read 31% less TTFT than the
harness and the bare client (both on ``/v1/chat/completions``), and agreed within 5% where all
three used completions. This isolates the endpoint: one client, the same recorded conversations
(trace mode: the recorded answers in the history), the same tokens for the server (the chat
template rendered with ``add_special_tokens: false``, as ``workloads.benchserve`` sends it),
turn-major at a fixed concurrency, the two endpoints alternating round by round, each round from
a prefix-cache reset. What differs is only the server's own work per request before tokenization
(message parsing and validation, the template's render).

Run against a server you started (with ``VLLM_SERVER_DEV_MODE=1`` for the reset):
``python benchmarks/chat_vs_completions.py --base-url URL --model NAME --model-dir DIR
--sessions FILE.jsonl [--concurrency 4] [--rounds 3] [--output-tokens 16]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from workloads.benchserve import chat_renderer  # noqa: E402
from workloads.loaders import load_sessions  # noqa: E402
from workloads.spec import RecordedWorkload  # noqa: E402


def conversations(path: str, max_context: int) -> list[list[dict[str, str]]]:
    """Every request of the recorded sessions (trace mode), turn-major: the message history it sends."""
    spec = RecordedWorkload(name="x", path=Path(path), mode="trace", max_context_tokens=max_context)
    per_session = []
    for s in load_sessions(spec):
        history, out = [], []
        for t in s.turns:
            history += [{"role": m.role, "content": m.content} for m in t.messages or ()]
            out.append(list(history))
            history.append({"role": "assistant", "content": t.recorded_answer or ""})
        per_session.append(out)
    turns = max(len(x) for x in per_session)
    return [x[k] for k in range(turns) for x in per_session if k < len(x)]


async def one(http, url: str, body: dict) -> float | None:
    t0 = time.perf_counter()
    async with http.post(url, json=body) as resp:
        if resp.status >= 400:
            return None
        async for line in resp.content:
            if line.startswith(b"data:") and b'"choices"' in line and line.strip() != b"data: [DONE]":
                obj = json.loads(line[5:])
                if obj.get("choices"):
                    return time.perf_counter() - t0
    return None


async def round_(base: str, model: str, convs, render, chat: bool, concurrency: int, out_tokens: int) -> list[float]:
    slots = asyncio.Semaphore(concurrency)
    stream = {"include_usage": True, "continuous_usage_stats": True}
    common = {"model": model, "max_tokens": out_tokens, "min_tokens": out_tokens, "ignore_eos": True,
              "temperature": 0, "stream": True, "stream_options": stream}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as http:
        async def send(msgs):
            async with slots:
                if chat:
                    return await one(http, base + "/v1/chat/completions", {**common, "messages": msgs})
                return await one(http, base + "/v1/completions",
                                 {**common, "prompt": render([_M(m) for m in msgs]), "add_special_tokens": False})
        got = await asyncio.gather(*(send(m) for m in convs))
    return [g for g in got if g is not None]


class _M:
    def __init__(self, m: dict[str, str]) -> None:
        self.role, self.content = m["role"], m["content"]


def reset(base: str) -> None:
    urllib.request.urlopen(urllib.request.Request(base + "/reset_prefix_cache", method="POST"), timeout=30).read()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--model-dir", required=True, help="folder with tokenizer_config.json (its chat template)")
    ap.add_argument("--sessions", required=True)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--output-tokens", type=int, default=16)
    ap.add_argument("--max-context-tokens", type=int, default=3500)
    args = ap.parse_args()
    convs = conversations(args.sessions, args.max_context_tokens)
    render = chat_renderer(args.model_dir)
    print(f"{len(convs)} requests per round, concurrency {args.concurrency}, {args.output_tokens} output tokens")
    res: dict[str, list[float]] = {"chat": [], "completions": []}
    for r in range(args.rounds):
        order = ("chat", "completions") if r % 2 == 0 else ("completions", "chat")
        for name in order:
            reset(args.base_url)
            ttft = asyncio.run(round_(args.base_url, args.model, convs, render, name == "chat", args.concurrency,
                                      args.output_tokens))
            p50 = statistics.median(ttft) * 1e3
            res[name].append(p50)
            print(f"round {r} {name:11s}: {len(ttft)} ok, TTFT p50 {p50:.1f} ms")
    c, k = statistics.median(res["chat"]), statistics.median(res["completions"])
    print(f"median over rounds: chat {c:.1f} ms, completions {k:.1f} ms, completions/chat {k / c:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
