"""Build recorded coding-agent sessions from real text on this machine, for ``kind: recorded`` sweeps.

Why: the starved regime is decided by the frontend's tokenization of long agent contexts, so the
text must tokenize like what a coding agent really sends (DESIGN.md, "The prompt text decides
whether a frontend queue forms"). No recorded agent trajectories ship with the project; this
script writes ``abench-session-jsonl-v1`` sessions whose every message is real text read from the
running interpreter's standard library, shaped like a coding agent's session:

* the system prompt: the real prose of a library's documentation strings (~``--system-tokens``);
* the first user turn: a task naming a real module and a real function of it;
* every later turn appends a tool result: a real chunk of Python source (~``--tool-tokens``),
  as ``cat`` or ``grep`` would show it to the agent;
* the recorded answers: the first lines of real docstrings (the answers' length is forced to
  ``output_tokens`` when replayed; in ``mode: live`` the server's own answers are used);
* sessions grow until ``--context-tokens``.

Token counts are estimated at 3.6 characters per token (Python source with a BPE vocabulary of
128k-151k entries); pass ``--tokenizer tokenizer.json`` to count exactly. Deterministic for one
Python release: the files are taken in sorted order from a seeded shuffle.

Run: ``python benchmarks/agent_sessions.py OUT.jsonl [--sessions 16] [--context-tokens 14000]``.
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import sysconfig
from pathlib import Path

CHARS_PER_TOKEN = 3.6


def _sources(seed: int) -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "test" not in p.parts and p.stat().st_size > 8000)
    random.Random(seed).shuffle(files)
    return files


def _docstrings(tree: ast.AST) -> list[tuple[str, str]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc and len(doc) > 40:
                out.append((node.name, doc))
    return out


def build(n_sessions: int, system_tokens: int, tool_tokens: int, context_tokens: int, output_tokens: int,
          seed: int, count=None) -> list[dict]:
    """The sessions (pure but for reading the standard library's files)."""
    count = count or (lambda text: int(len(text) / CHARS_PER_TOKEN))
    files = _sources(seed)
    docs: list[str] = []
    parsed: list[tuple[Path, str, list[tuple[str, str]]]] = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
            parsed.append((path, text, _docstrings(ast.parse(text))))
        except (UnicodeDecodeError, SyntaxError, ValueError):
            continue
        if len(parsed) >= n_sessions * 12:
            break
    for _, _, ds in parsed:
        docs.extend(d for _, d in ds)
    system, k = ["You are a coding agent working in a Python repository. Use the tools to read files and "
                 "run commands. Reference documentation follows.\n"], 0
    while count("\n".join(system)) < system_tokens and k < len(docs):
        system.append(docs[k])
        k += 1
    system_prompt = "\n\n".join(system)
    sessions = []
    rng = random.Random(seed + 1)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for s in range(n_sessions):
        path, text, ds = parsed[s % len(parsed)]
        name, doc = ds[0] if ds else (path.stem, path.stem)
        rel = path.relative_to(stdlib)
        task = (f"In {rel}, `{name}` misbehaves on edge cases: {doc.splitlines()[0]} "
                f"Find the cause, fix it and run the tests.")
        answers = [d.splitlines()[0] for _, d in ds] or [f"Reading {rel}."]
        turns = [{"input_delta": [{"role": "user", "content": task}], "assistant_text": answers[0],
                  "output_tokens": output_tokens, "pre_gap_ms": 0}]
        used = count(system_prompt) + count(task) + output_tokens
        chunks = [(p, t) for p, t, _ in parsed[s + 1:] + parsed[:s + 1]]
        j = 0
        while True:
            src_path, src = chunks[j % len(chunks)]
            j += 1
            lines = src.splitlines()
            start = rng.randrange(0, max(1, len(lines) - 50))
            body, end = [], start
            while end < len(lines) and count("\n".join(body)) < tool_tokens:
                body.append(f"{end + 1:6d}\t{lines[end]}")
                end += 1
            tool = f"$ cat -n {src_path.relative_to(stdlib)} | sed -n {start + 1},{end}p\n" + "\n".join(body)
            if used + count(tool) + output_tokens > context_tokens:
                break
            used += count(tool) + output_tokens
            turns.append({"input_delta": [{"role": "user", "content": tool}],
                          "assistant_text": answers[len(turns) % len(answers)], "output_tokens": output_tokens,
                          "pre_gap_ms": 0})
        sessions.append({"session_id": f"agent-{s:02d}", "system_prompt": system_prompt, "turns": turns})
    return sessions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--system-tokens", type=int, default=1100)
    ap.add_argument("--tool-tokens", type=int, default=1500)
    ap.add_argument("--context-tokens", type=int, default=14000)
    ap.add_argument("--output-tokens", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", default=None, help="count tokens exactly with this tokenizer.json")
    args = ap.parse_args()
    count = None
    if args.tokenizer:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(args.tokenizer)
        count = lambda text: len(tok.encode(text, add_special_tokens=False).ids)  # noqa: E731
    sessions = build(args.sessions, args.system_tokens, args.tool_tokens, args.context_tokens, args.output_tokens,
                     args.seed, count)
    with open(args.out, "w", encoding="utf-8") as fh:
        for s in sessions:
            fh.write(json.dumps(s) + "\n")
    turns = [len(s["turns"]) for s in sessions]
    chars = [len(s["system_prompt"]) + sum(len(m["content"]) for t in s["turns"] for m in t["input_delta"])
             for s in sessions]
    print(f"{len(sessions)} sessions, turns {min(turns)}-{max(turns)}, final context {min(chars)}-{max(chars)} chars "
          f"(~{min(chars) / CHARS_PER_TOKEN:.0f}-{max(chars) / CHARS_PER_TOKEN:.0f} tokens) -> {args.out}")


if __name__ == "__main__":
    main()
