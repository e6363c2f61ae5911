"""Helpers shared by the trace loaders: the one error type, and prompt clipping.

A malformed trace must fail before a trial starts, and say exactly where: a message such as
``conversation_trace.jsonl:17: hash_ids must be a list of ints`` lets a user fix the file
without reading our code.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..trace import Block, WorkloadInputError


class TraceError(WorkloadInputError):
    """A trace file that cannot be replayed; ``str()`` is ``<file name>:<line>: <problem>``."""

    def __init__(self, path: Path | str, line: int, problem: str) -> None:
        self.path = Path(path)
        self.line = line
        self.problem = problem
        super().__init__(f"{self.path.name}:{line}: {problem}")

    def __reduce__(self) -> tuple[type[TraceError], tuple[Path, int, str]]:
        # Ray pickles a task's exception to return it. The default reduction replays
        # ``self.args`` (the one formatted message) into ``__init__``, which takes three
        # arguments, so unpickling failed and the caller saw a different error.
        return type(self), (self.path, self.line, self.problem)


def is_int(value: object) -> bool:
    """True for a real int (JSON ``true`` parses as bool, a subclass of int, and is rejected)."""
    return isinstance(value, int) and not isinstance(value, bool)


def clip_blocks(blocks: list[Block], max_tokens: int | None) -> list[Block]:
    """Keep the leading blocks up to ``max_tokens`` tokens in all (the prefix, so cache reuse
    is preserved); the block that crosses the limit is shortened."""
    if max_tokens is None:
        return blocks
    out: list[Block] = []
    left = max_tokens
    for block in blocks:
        if left <= 0:
            break
        out.append(block if block.tokens <= left else Block(block.hash_id, left))
        left -= block.tokens
    return out


def open_trace(path: Path) -> Path:
    """Resolve ``path`` and fail with a TraceError naming it if it is not a readable file."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise TraceError(p, 0, "no such trace file")
    return p


def json_object(path: Path, line: int, text: str, what: str = "") -> dict:
    """One JSONL line parsed as a JSON object, or a TraceError naming the line."""
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise TraceError(path, line, f"invalid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise TraceError(path, line, "each line must be a JSON object" + (f" ({what})" if what else ""))
    return obj

