"""Mooncake trace loader (FAST'25 release): JSONL with timestamp, input/output lengths and hash ids.

Each line is one request, replayed open loop at ``timestamp`` (ms, relative) x ``time_scale``.
``hash_ids`` lists one id per ``block_tokens``-token block of the prompt; equal ids across
lines mean a shared prefix. Each id becomes ``TextFactory.block(id, block_tokens)`` (the last
block is partial, so the prompt has exactly ``input_length`` tokens), which makes vLLM's
prefix cache hit exactly where the trace says the original system's cache did.

Every line is validated; the first bad one raises ``TraceError`` naming file and line.
"""

from __future__ import annotations

from pathlib import Path

from ..spec import MooncakeWorkload
from ..trace import Block, Session, Turn
from ._common import TraceError, clip_blocks, is_int, json_object, open_trace


def _blocks(path: Path, line: int, obj: dict, block_tokens: int) -> list[Block]:
    length, ids = obj["input_length"], obj["hash_ids"]
    if not isinstance(ids, list) or not all(is_int(h) and h >= 0 for h in ids):
        raise TraceError(path, line, "hash_ids must be a list of ints")
    need = -(-length // block_tokens)  # ceil: the last block may be partial
    if len(ids) != need:
        raise TraceError(path, line, f"hash_ids has {len(ids)} blocks but input_length {length} "
                                     f"needs {need} blocks of {block_tokens} tokens")
    last = length - (need - 1) * block_tokens
    return [Block(h, block_tokens) for h in ids[:-1]] + [Block(ids[-1], last)]


def _parse(path: Path, line: int, text: str, block_tokens: int) -> tuple[float, list[Block], int]:
    obj = json_object(path, line, text)
    for key in ("timestamp", "input_length", "output_length", "hash_ids"):
        if key not in obj:
            raise TraceError(path, line, f"missing field {key!r}")
    ts = obj["timestamp"]
    if not (is_int(ts) or isinstance(ts, float)) or ts < 0:
        raise TraceError(path, line, "timestamp must be a number of ms >= 0")
    for key in ("input_length", "output_length"):
        if not is_int(obj[key]) or obj[key] < 1:
            raise TraceError(path, line, f"{key} must be an int >= 1")
    return float(ts), _blocks(path, line, obj, block_tokens), obj["output_length"]


def load_mooncake(spec: MooncakeWorkload) -> list[Session]:
    """One single-turn session per line, ``start_s`` relative to the earliest timestamp."""
    path = open_trace(spec.path)
    rows: list[tuple[int, float, list[Block], int]] = []
    with path.open(encoding="utf-8") as fh:
        for line_no, text in enumerate(fh, start=1):
            if not text.strip():
                continue  # tolerate blank lines (a trailing newline, or files joined by cat)
            if spec.max_requests is not None and len(rows) >= spec.max_requests:
                break
            ts, blocks, out = _parse(path, line_no, text, spec.block_tokens)
            rows.append((line_no, ts, clip_blocks(blocks, spec.max_context_tokens), out))
    if not rows:
        raise TraceError(path, 0, "trace has no requests")
    t0 = min(ts for _, ts, _, _ in rows)
    return [Session(session_id=f"{path.stem}-{line_no}",
                    turns=(Turn(append=tuple(blocks), output_tokens=out),),
                    start_s=(ts - t0) / 1000.0 * spec.time_scale)
            for line_no, ts, blocks, out in rows]


__all__ = ["load_mooncake"]
