"""A bare cross-check client: a trial's exact workload with the harness stripped to the minimum.

Why: every figure of a trial is measured through the harness (a Ray actor, telemetry
samplers, the load generator's seams). To show that the harness does not distort TTFT, the
same workload is replayed against the same replica from the same start state by this
deliberately small, independent client, and the two TTFTs are compared
(:func:`crosscheck_ratio`). It shares only what defines the workload: the loaders
(``load_sessions``), the text (``TextFactory``) and the spec; it does not import
``workloads.client`` or ``workloads.loadgen``, so a bug there cannot hide in both.

What it does, kept equal to the product on purpose:
  * the same prompts: turn k is the context so far plus the real answer, then turn k's text;
  * the same request body (``model, prompt, max_tokens, min_tokens = max_tokens, ignore_eos,
    temperature 0, stream, stream_options.include_usage + continuous_usage_stats``), and for a
    structured-output turn its ``response_format`` in place of the forced length (``structured``);
  * recorded sessions (chat) go to ``/v1/chat/completions`` with ``messages`` in place of
    ``prompt`` and the same other fields; the history is every turn's recorded messages, and
    after each answer an assistant message holding the recorded answer (``mode: trace``) or
    the server's own (``mode: live``); chunk text is then in ``choices[].delta.content``;
  * closed loop at ``concurrency`` for agentic and recorded workloads, open loop by
    ``start_s`` (at most ``max_in_flight`` at once) for traces; a session with ``start_s``
    (traces, or ``session_rate_per_s``) is not started before it, in either loop, as the
    product does; the window ``max_duration_s``, ``drain_s`` and the per-request deadline
    ``request_timeout_s``; the think time ``think_s`` before every later turn.
And nothing else: the stdlib asyncio loop, one aiohttp session (``trust_env=False``),
``time.perf_counter_ns()`` stamped on the first chunk that carries a choice, text or not:
vLLM's own benchmark (``vllm bench serve``) counts TTFT that way, since a first token can
decode to no text yet (a partial UTF-8 sequence, a special token). Stamping the first
*non-empty* text instead made TTFT the time of a later token for such requests.

Run: ``python -m workloads.bare --base-url URL --model NAME --tokenizer PATH
--workload-json FILE --out FILE [--cpus 3,4]``. ``--out`` gets one JSON line per request
(``request_id, ttft_s, e2e_s, prompt_tokens, completion_tokens, status``, plus ``error``)
and a final ``{"summary": true, ...}`` line. Exit status 2: a bad workload file, a
tokenizer that does not load, or an unreachable server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from pydantic import TypeAdapter, ValidationError

from .loaders import TraceError, in_flight, load_sessions, text_style
from .spec import WorkloadSpec
from .structured import length_fields
from .text import TextFactory, load_tokenizer
from .trace import ResponseFormat

_NS = 1e9


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile with linear interpolation (numpy's default); None if empty."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def crosscheck_ratio(harness_ttft_s: Sequence[float], bare_ttft_s: Sequence[float]) -> dict[str, float | None]:
    """TTFT of the harness against the bare client on the same workload and start state.

    ``ttft_p50_ratio = p50(harness) / p50(bare)`` and the same at p90 (None where either side
    has no TTFT or the bare one is 0); above 1 means the harness adds latency. Also both
    sides' p50 in seconds and counts.
    """
    out: dict[str, float | None] = {"harness_count": float(len(harness_ttft_s)), "bare_count": float(len(bare_ttft_s))}
    for q in (50, 90):
        h, b = percentile(harness_ttft_s, q), percentile(bare_ttft_s, q)
        out[f"ttft_p{q}_ratio"] = h / b if h is not None and b is not None and b > 0 else None
        if q == 50:
            out["ttft_p50_harness_s"], out["ttft_p50_bare_s"] = h, b
    return out


class BareError(Exception):
    """A reason to stop before sending anything; the message is shown to the user."""


def parse_cpus(text: str) -> set[int]:
    """``"3,4"`` or ``"0-3,8"`` -> a set of cpu ids."""
    cpus: set[int] = set()
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise BareError(f"--cpus {text!r} is not a cpu list such as 3,4 or 0-3") from None
    if not cpus:
        raise BareError("--cpus is empty")
    return cpus


def pin(cpus: set[int]) -> None:
    """Pin this process and every thread it has to ``cpus`` (threads started later inherit it).
    The one implementation: the workload actor and the overhead benchmark call it too."""
    os.sched_setaffinity(0, cpus)
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), cpus)


def load_workload(path: str) -> Any:
    """The workload spec from a JSON file (the trial's ``workload``), or BareError saying why not."""
    try:
        return TypeAdapter(WorkloadSpec).validate_json(Path(path).read_bytes())
    except OSError as exc:
        raise BareError(f"cannot read workload file {path}: {exc}") from None
    except ValidationError as exc:
        raise BareError(f"bad workload file {path}: {exc}") from None


def prepare(spec: Any, tokenizer: str) -> tuple[Any, list[Any]]:
    """The product's text factory and sessions for ``spec``."""
    try:
        tok = load_tokenizer(tokenizer)
    except Exception as exc:  # noqa: BLE001 - tokenizers raises its own exception types
        raise BareError(f"cannot load tokenizer {tokenizer}: {exc}") from None
    # The product's style (workloads.run_workload makes its factory the same way): the cross-check must
    # send text that costs what the product's text costs to tokenize, never a silent default.
    style = text_style(spec)
    try:
        factory = TextFactory(tok, style=style)
    except ValueError as exc:  # an unknown style, or a tokenizer the style cannot use
        raise BareError(f"bad text_style {style!r}: {exc}") from None
    try:
        sessions = load_sessions(spec, factory)
    except (TraceError, ValueError) as exc:
        raise BareError(f"bad workload: {exc}") from None
    return factory, sessions


async def check_reachable(base_url: str, timeout_s: float = 10.0) -> None:
    """Open one TCP connection to the server, or raise BareError."""
    url = urlsplit(base_url)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(url.hostname, port), timeout_s)
    except (TimeoutError, OSError) as exc:
        raise BareError(f"cannot reach the server at {base_url}: {exc or type(exc).__name__}") from None
    writer.close()
    await writer.wait_closed()


class BareClient:
    """Replays sessions: one coroutine per session, turns in order, one aiohttp session.

    ``url`` is the completions URL; ``chat_url`` (``/v1/chat/completions``) serves chat sessions."""

    def __init__(self, http: aiohttp.ClientSession, url: str, model: str, spec: Any, render: Any,
                 chat_url: str | None = None) -> None:
        self.http, self.url, self.model, self.spec, self.render = http, url, model, spec, render
        self.chat_url = chat_url or url.rsplit("/v1/", 1)[0] + "/v1/chat/completions"
        self.rows: list[dict[str, Any]] = []
        self.window_end = 0.0
        self.cut_at: float | None = None

    async def run(self, sessions: list[Any]) -> None:
        spec = self.spec
        slots = asyncio.Semaphore(in_flight(spec))
        t0 = time.perf_counter()
        self.window_end = t0 + spec.max_duration_s
        self.cut_at = None if spec.drain_s is None else self.window_end + spec.drain_s
        # By arrival in both loops, as the product does (stable: sessions without start_s keep
        # the loader's order); a planned arrival is waited for in a closed loop too.
        ordered = sorted(sessions, key=lambda s: s.start_s or 0.0)
        async with asyncio.TaskGroup() as group:
            for session in ordered:
                if session.start_s is not None:
                    await asyncio.sleep(max(0.0, t0 + session.start_s - time.perf_counter()))
                if time.perf_counter() >= self.window_end:
                    break
                await slots.acquire()
                if time.perf_counter() >= self.window_end:
                    slots.release()
                    break
                group.create_task(self._session(session, slots))

    async def _session(self, session: Any, slots: asyncio.Semaphore) -> None:
        if getattr(session, "is_chat", False):
            return await self._chat_session(session, slots)
        try:
            context: list[str] = []
            for k, turn in enumerate(session.turns):
                context.append(self.render(turn.append))
                if k > 0 and turn.think_s:
                    await asyncio.sleep(turn.think_s)
                if time.perf_counter() >= self.window_end:
                    return
                row, answer = await self._send(f"{session.session_id}:{k}", "".join(context), turn.output_tokens,
                                               fmt=turn.response_format)
                self.rows.append(row)
                if row["status"] != "ok":
                    return
                context.append(answer)
        finally:
            slots.release()

    async def _chat_session(self, session: Any, slots: asyncio.Semaphore) -> None:
        """A recorded session: the history is chat messages; each answer goes in as an assistant
        message, the recorded one when the turn has it (trace mode), else the server's (live)."""
        try:
            history: list[dict[str, str]] = []
            for k, turn in enumerate(session.turns):
                history.extend({"role": m.role, "content": m.content} for m in turn.messages)
                if k > 0 and turn.think_s:
                    await asyncio.sleep(turn.think_s)
                if time.perf_counter() >= self.window_end:
                    return
                row, answer = await self._send(f"{session.session_id}:{k}", None, turn.output_tokens,
                                               messages=history, fmt=turn.response_format)
                self.rows.append(row)
                if row["status"] != "ok":
                    return
                recorded = turn.recorded_answer
                history.append({"role": "assistant", "content": recorded if recorded is not None else answer})
        finally:
            slots.release()

    async def _send(self, request_id: str, prompt: str | None, max_tokens: int,
                    messages: list[dict[str, str]] | None = None,
                    fmt: ResponseFormat | None = None) -> tuple[dict[str, Any], str]:
        # The product's body, field for field; a chat request differs only by messages for prompt.
        first_field = {"prompt": prompt} if messages is None else {"messages": messages}
        body = json.dumps({
            "model": self.model, **first_field, **length_fields(max_tokens, fmt), "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }).encode()
        url = self.url if messages is None else self.chat_url
        st: dict[str, Any] = {"first": None, "text": [], "prompt_tokens": None, "completion_tokens": None}
        status, error = "ok", None
        sent = time.perf_counter_ns()
        limit_s, limit_status = self.spec.request_timeout_s, "timeout"
        if self.cut_at is not None and self.cut_at - time.perf_counter() < limit_s:
            limit_s, limit_status = max(0.0, self.cut_at - time.perf_counter()), "cut"
        try:
            async with asyncio.timeout(limit_s):
                await self._stream(url, body, st)
        except TimeoutError:
            status, error = limit_status, f"no complete answer within {limit_s:.3f} s"
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            status, error = "error", f"{type(exc).__name__}: {exc}"
        end = time.perf_counter_ns()
        row: dict[str, Any] = {"request_id": request_id,
               "ttft_s": None if st["first"] is None else (st["first"] - sent) / _NS,
               "e2e_s": (end - sent) / _NS, "prompt_tokens": st["prompt_tokens"],
               "completion_tokens": st["completion_tokens"], "status": status}
        if error:
            row["error"] = error
        return row, "".join(st["text"])

    async def _stream(self, url: str, body: bytes, st: dict[str, Any]) -> None:
        async with self.http.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
            if resp.status >= 400:
                raise ValueError(f"HTTP {resp.status}: {(await resp.text(errors='replace'))[:300]}")
            buf = b""
            async for data in resp.content.iter_any():
                now = time.perf_counter_ns()
                buf += data.replace(b"\r\n", b"\n")
                *events, buf = buf.split(b"\n\n")
                for event in events:
                    for line in event.split(b"\n"):
                        if not line.startswith(b"data:"):
                            continue
                        payload = line[5:].strip()
                        if payload == b"[DONE]":
                            return
                        obj = json.loads(payload)
                        if "error" in obj and not obj.get("choices"):
                            raise ValueError(f"server error event: {str(obj['error'])[:300]}")
                        choices = obj.get("choices") or []
                        if choices and st["first"] is None:
                            st["first"] = now  # vllm bench serve's TTFT: the first chunk with a choice
                        for choice in choices:
                            # completions: "text"; chat: "delta.content" (None or "" in the role chunk)
                            text = choice.get("text") if "text" in choice else (choice.get("delta") or {}).get("content")
                            if text:
                                st["text"].append(text)
                        usage = obj.get("usage") or {}
                        if usage.get("prompt_tokens") is not None:
                            st["prompt_tokens"] = int(usage["prompt_tokens"])
                        if usage.get("completion_tokens") is not None:
                            st["completion_tokens"] = int(usage["completion_tokens"])
            raise ValueError("stream ended without [DONE]")


def summary(rows: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """The final line: counts, TTFT p50/p90/p99 and e2e p50 of ok requests, and the wall time."""
    ok = [r for r in rows if r["status"] == "ok"]
    ttft = [r["ttft_s"] for r in ok if r["ttft_s"] is not None]
    e2e = [r["e2e_s"] for r in ok]
    return {"summary": True, "count": len(rows), "ok": len(ok), "ttft_p50_s": percentile(ttft, 50),
            "ttft_p90_s": percentile(ttft, 90), "ttft_p99_s": percentile(ttft, 99),
            "e2e_p50_s": percentile(e2e, 50), "wall_s": wall_s}


async def replay(spec: Any, sessions: list[Any], render: Any, base_url: str, model: str) -> tuple[list[dict], float]:
    """Replay ``sessions``; return the per-request rows and the wall time."""
    await check_reachable(base_url)
    slots = in_flight(spec)
    connector = aiohttp.TCPConnector(limit=slots, limit_per_host=slots)  # no queue inside aiohttp
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False,
                                     read_bufsize=1 << 20) as http:
        root = base_url.rstrip("/")
        client = BareClient(http, root + "/v1/completions", model, spec, render, chat_url=root + "/v1/chat/completions")
        t0 = time.perf_counter()
        await client.run(sessions)
        return client.rows, time.perf_counter() - t0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workloads.bare", description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenizer", required=True, help="tokenizer.json, or a folder holding one")
    ap.add_argument("--workload-json", required=True, help="the workload spec as JSON")
    ap.add_argument("--out", required=True, help="JSON lines: one per request, then a summary")
    ap.add_argument("--cpus", default=None, help="pin every thread to these cpus, e.g. 3,4")
    args = ap.parse_args(argv)
    try:
        if args.cpus:
            pin(parse_cpus(args.cpus))  # first, so threads started later (tokenizers) inherit it
        spec = load_workload(args.workload_json)
        factory, sessions = prepare(spec, args.tokenizer)
        # The set-up heap (word pool, sessions) out of the collector: no full-GC stall in the window.
        gc.collect()
        gc.freeze()
        rows, wall_s = asyncio.run(replay(spec, sessions, factory.render, args.base_url, args.model))
    except BareError as exc:
        print(f"workloads.bare: {exc}", file=sys.stderr)
        return 2
    with open(args.out, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
        fh.write(json.dumps(summary(rows, wall_s)) + "\n")
    s = summary(rows, wall_s)
    print(f"workloads.bare: {s['ok']}/{s['count']} ok, ttft p50 {s['ttft_p50_s']} s, wall {wall_s:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["BareClient", "BareError", "crosscheck_ratio", "main", "parse_cpus", "percentile", "pin",
           "summary"]
