"""Azure LLM inference trace 2023 loader (Splitwise): CSV of TIMESTAMP, ContextTokens, GeneratedTokens.

Each row is one request, replayed open loop at its timestamp (relative to the earliest row)
x ``time_scale``. The trace has no session ids and no prefix hashes, so every prompt is
unique text of exactly ``ContextTokens`` tokens: it measures tokenization and prefill without
prefix-cache help, the opposite of the agentic pattern.

Every row is validated; the first bad one raises ``TraceError`` naming file and line.
"""

from __future__ import annotations

import csv
from datetime import datetime
from pathlib import Path

from ..spec import AzureWorkload
from ..text import stable_id
from ..trace import Block, Session, Turn
from ._common import TraceError, clip_blocks, open_trace

_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_EPOCH = datetime(1970, 1, 1)


def _timestamp_ns(path: Path, line: int, text: str) -> int:
    """``2023-11-16 18:17:03.9799600`` -> ns. Seven fraction digits are more than datetime
    parses, so the fraction is read as an integer; no time zone is given, and only
    differences are used, so it is read as UTC."""
    main, _, frac = text.strip().partition(".")
    try:
        whole = datetime.strptime(main, "%Y-%m-%d %H:%M:%S")
        frac_ns = int(frac.ljust(9, "0")[:9]) if frac else 0
    except ValueError:
        raise TraceError(path, line, f"TIMESTAMP {text!r} is not 'YYYY-MM-DD HH:MM:SS[.fraction]'") from None
    return int((whole - _EPOCH).total_seconds()) * 1_000_000_000 + frac_ns


def _count(path: Path, line: int, name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise TraceError(path, line, f"{name} must be an int >= 1, got {text!r}") from None
    if value < 1:
        raise TraceError(path, line, f"{name} must be an int >= 1, got {value}")
    return value


def load_azure(spec: AzureWorkload) -> list[Session]:
    """One single-turn session per row, ``start_s`` relative to the earliest timestamp."""
    path = open_trace(spec.path)
    rows: list[tuple[int, int, int, int]] = []
    with path.open(encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header) != _COLUMNS:
            raise TraceError(path, 1, f"header must be {','.join(_COLUMNS)}, got {header!r}")
        for fields in reader:
            line = reader.line_num
            if not fields or not "".join(fields).strip():
                continue
            if spec.max_requests is not None and len(rows) >= spec.max_requests:
                break
            if len(fields) != len(_COLUMNS):
                raise TraceError(path, line, f"expected {len(_COLUMNS)} fields, got {len(fields)}")
            rows.append((line, _timestamp_ns(path, line, fields[0]),
                         _count(path, line, "ContextTokens", fields[1]),
                         _count(path, line, "GeneratedTokens", fields[2])))
    if not rows:
        raise TraceError(path, 0, "trace has no requests")
    t0 = min(ts for _, ts, _, _ in rows)
    sessions = []
    for line, ts, context, generated in rows:
        # A unique id per (file, row, seed): no two prompts share a prefix, as in the trace.
        blocks = clip_blocks([Block(stable_id("azure", path.name, line, spec.seed), context)],
                             spec.max_context_tokens)
        sessions.append(Session(session_id=f"{path.stem}-{line}",
                                turns=(Turn(append=tuple(blocks), output_tokens=generated),),
                                start_s=(ts - t0) / 1e9 * spec.time_scale))
    return sessions


__all__ = ["load_azure"]
