"""Recorded agent sessions with their real text, replayed through the chat endpoint.

Why: synthetic text measures its own tokenization cost (DESIGN.md, "The prompt text decides
whether a frontend queue forms"); a recorded trajectory tokenizes exactly like the agent's
real context. One session per line (blank lines are skipped), in one of two formats, the
same for a whole file; a file may be zstd-compressed (``.jsonl.zst``; detected from the
zstd magic bytes, whatever the name):

  * ``abench`` (agentic-bench's ``abench-session-jsonl-v1``, its DeepSWE and LMCache
    sessions): ``{"system_prompt": str|null, "turns": [turn, ...]}``. A turn is
    ``{"input_delta": [{"role", "content"}, ...], "assistant_text": str,
    "output_tokens": int, "input_tokens": int|null, "cached_tokens": int|null,
    "pre_gap_ms": number|null}``: the messages appended before this turn's request, the
    recorded answer, its token counts, and the tool/think gap before the turn.
    ``input_delta``, ``assistant_text`` and ``output_tokens`` are required; the others may
    be absent or null. A non-empty ``system_prompt`` becomes a leading system message.
  * ``chat``: ``{"messages": [{"role", "content"}, ...], "id": optional}``. Every assistant
    message ends a turn: the messages since the previous one are its delta, its content is
    the recorded answer. Messages after the last assistant message have no answer to replay
    and are dropped. There are no token counts or gaps.

Lenient about what it does not use (unknown fields, extra message keys such as
``tool_call_id``: a later schema revision may add some), strict about what it does: a
missing or mistyped required field raises ``TraceError`` as ``file:line: problem``. The
session id is the line's ``session_id`` or ``id``, else ``<file stem>-<line>``.

Prompt size, for ``max_context_tokens`` and as the fallback token count: the turn's recorded
``input_tokens`` where present, else the characters of the history's message contents
divided by ``CHARS_PER_TOKEN`` (4, the usual average of BPE tokenizers on English and code;
it ignores the chat template's few tokens per message). In live mode an answer counts as
its forced ``output_tokens``. Chat-format answers are forced to the same estimate of their
recorded text.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..spec import RecordedWorkload
from ..text import stable_id
from ..trace import Message, Session, Turn
from ._common import TraceError, is_int, json_object, open_trace

CHARS_PER_TOKEN = 4.0
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class _RawTurn:
    delta: tuple[Message, ...]
    answer: str
    output_tokens: int | None  # None: not recorded (chat format)
    input_tokens: int | None
    gap_ms: float


def estimate_tokens(chars: int) -> int:
    """Tokens of ``chars`` characters of text by the documented estimate (at least 1)."""
    return max(1, math.ceil(chars / CHARS_PER_TOKEN))


def _chunks(path: Path) -> Iterator[bytes]:
    """The file's bytes in chunks, decompressed if it starts with the zstd magic bytes.

    A decompression object per frame (files may hold several, e.g. joined with ``cat``), so
    a truncated last frame is detected: zstandard's stream reader ends such a file silently.
    """
    with path.open("rb") as fh:
        head = fh.read(4)
        fh.seek(0)
        if head != _ZSTD_MAGIC:
            while chunk := fh.read(_CHUNK):
                yield chunk
            return
        import zstandard  # optional: only needed for compressed files

        dctx = zstandard.ZstdDecompressor()
        dobj, pending = dctx.decompressobj(), b""
        try:
            while data := pending or fh.read(_CHUNK):
                pending = b""
                yield dobj.decompress(data)
                if dobj.eof:  # a frame ended: the rest (if any) starts the next frame
                    pending, dobj = dobj.unused_data, dctx.decompressobj()
                    if not pending and not (pending := fh.read(_CHUNK)):
                        return
        except zstandard.ZstdError as exc:
            raise TraceError(path, 0, f"zstd: {exc}") from None
        raise TraceError(path, 0, "zstd: the file ends inside a frame (truncated)")


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """Non-blank lines with their 1-based numbers (of the decompressed text)."""
    line_no, buf = 0, b""
    for chunk in _chunks(path):
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for raw in lines:
            line_no += 1
            if text := _decode(path, line_no, raw):
                yield line_no, text
    if buf and (text := _decode(path, line_no + 1, buf)):
        yield line_no + 1, text


def _decode(path: Path, line: int, raw: bytes) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise TraceError(path, line, "not UTF-8 text") from None
    return text if text.strip() else ""


def _messages(path: Path, line: int, value: object, where: str) -> tuple[Message, ...]:
    if not isinstance(value, list):
        raise TraceError(path, line, f"{where} must be a list of messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise TraceError(path, line, f"{where}[{i}] must be an object with role and content")
        role, content = m.get("role"), m.get("content")
        if not isinstance(role, str) or not role:
            raise TraceError(path, line, f"{where}[{i}].role must be a non-empty string")
        if not isinstance(content, str):
            raise TraceError(path, line, f"{where}[{i}].content must be a string")
        out.append(Message(role, content))
    return tuple(out)


def _count(path: Path, line: int, obj: dict, key: str, where: str, *, required: bool) -> int | None:
    if key not in obj and required:
        raise TraceError(path, line, f"{where}: missing field {key!r}")
    value = obj.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, int) or not is_int(value) or value < 0:
        raise TraceError(path, line, f"{where}.{key} must be an int >= 0")
    return value


def _session_id(path: Path, line: int, obj: dict) -> str:
    for key in ("session_id", "id"):
        value = obj.get(key)
        if isinstance(value, str) and value or is_int(value):
            return str(value)
        if value is not None:
            raise TraceError(path, line, f"{key} must be a non-empty string or an int")
    return f"{path.stem}-{line}"


def _parse_abench(path: Path, line: int, obj: dict) -> list[_RawTurn]:
    system = obj.get("system_prompt")
    if system is not None and not isinstance(system, str):
        raise TraceError(path, line, "system_prompt must be a string or null")
    if "turns" not in obj:
        raise TraceError(path, line, "missing field 'turns'")
    turns = obj["turns"]
    if not isinstance(turns, list) or not turns:
        raise TraceError(path, line, "turns must be a non-empty list")
    out = []
    for k, t in enumerate(turns):
        where = f"turns[{k}]"
        if not isinstance(t, dict):
            raise TraceError(path, line, f"{where} must be an object")
        for key in ("input_delta", "assistant_text"):
            if key not in t:
                raise TraceError(path, line, f"{where}: missing field {key!r}")
        delta = _messages(path, line, t["input_delta"], f"{where}.input_delta")
        if k == 0 and system:
            delta = (Message("system", system),) + delta
        if not isinstance(t["assistant_text"], str):
            raise TraceError(path, line, f"{where}.assistant_text must be a string")
        gap = t.get("pre_gap_ms")
        if gap is not None and (not (is_int(gap) or isinstance(gap, float)) or not 0 <= gap < math.inf):
            raise TraceError(path, line, f"{where}.pre_gap_ms must be a number of ms >= 0")
        _count(path, line, t, "cached_tokens", where, required=False)  # validated; not replayed
        out.append(_RawTurn(delta=delta, answer=t["assistant_text"],
                            output_tokens=_count(path, line, t, "output_tokens", where, required=True),
                            input_tokens=_count(path, line, t, "input_tokens", where, required=False),
                            gap_ms=float(gap or 0.0)))
    if not out[0].delta:
        raise TraceError(path, line, "the first turn has no messages to send (empty system_prompt and input_delta)")
    return out


def _parse_chat(path: Path, line: int, obj: dict) -> list[_RawTurn]:
    if "messages" not in obj:
        raise TraceError(path, line, "missing field 'messages'")
    messages = _messages(path, line, obj["messages"], "messages")
    out: list[_RawTurn] = []
    delta: list[Message] = []
    for m in messages:
        if m.role != "assistant":
            delta.append(m)
            continue
        if not out and not delta:
            raise TraceError(path, line, "messages start with an assistant message: the first turn has nothing to send")
        out.append(_RawTurn(delta=tuple(delta), answer=m.content, output_tokens=None, input_tokens=None, gap_ms=0.0))
        delta = []
    if not out:
        raise TraceError(path, line, "no assistant message: a chat session needs at least one answer to replay")
    return out


def _detect(path: Path, line: int, obj: dict) -> Literal["abench", "chat"]:
    if "turns" in obj:
        return "abench"
    if "messages" in obj:
        return "chat"
    raise TraceError(path, line, "cannot tell the format: expected 'turns' (abench-session-jsonl-v1) "
                                 "or 'messages' (chat JSONL)")


def read_recorded(path: Path, fmt: Literal["auto", "abench", "chat"] = "auto",
                  max_sessions: int | None = None) -> list[tuple[str, list[_RawTurn]]]:
    """Parse and validate the file: ``(session_id, turns)`` per session, in file order."""
    path = open_trace(path)
    sessions: list[tuple[str, list[_RawTurn]]] = []
    seen: set[str] = set()
    for line, text in _lines(path):
        if max_sessions is not None and len(sessions) >= max_sessions:
            break
        obj = json_object(path, line, text, "one session")
        if fmt == "auto":
            fmt = _detect(path, line, obj)  # the first session decides for the whole file
        turns = _parse_abench(path, line, obj) if fmt == "abench" else _parse_chat(path, line, obj)
        session_id = _session_id(path, line, obj)
        if session_id in seen:
            raise TraceError(path, line, f"duplicate session id {session_id!r}")
        seen.add(session_id)
        sessions.append((session_id, turns))
    if not sessions:
        raise TraceError(path, 0, "file has no sessions")
    return sessions


def _session(spec: RecordedWorkload, session_id: str, raw: list[_RawTurn], start_s: float | None) -> Session | None:
    turns: list[Turn] = []
    chars = 0  # history characters so far, for the estimate
    live_tokens = 0  # live mode: the server's answers, counted at their forced length
    for k, t in enumerate(raw):
        chars += sum(len(m.content) for m in t.delta)
        estimate = t.input_tokens if t.input_tokens is not None else estimate_tokens(chars) + live_tokens
        if spec.max_context_tokens is not None and estimate > spec.max_context_tokens:
            break
        if spec.output_tokens == "fixed":
            out = spec.fixed_output_tokens
        else:
            # At least 1: a request must generate something (a recorded 0 is an empty answer).
            out = max(1, t.output_tokens if t.output_tokens is not None else estimate_tokens(len(t.answer)))
        gap_s = 0.0 if k == 0 or spec.gaps == "drop" else t.gap_ms / 1000.0
        if spec.gaps == "scale":
            gap_s *= spec.gap_scale
        turns.append(Turn(append=(), output_tokens=out, think_s=gap_s, messages=t.delta,
                          recorded_answer=t.answer if spec.mode == "trace" else None,
                          recorded_prompt_tokens=t.input_tokens, prompt_tokens_estimate=estimate))
        if spec.mode == "trace":
            chars += len(t.answer)
        else:
            live_tokens += out
    if not turns:
        return None
    return Session(session_id=session_id, turns=tuple(turns), start_s=start_s)


def load_recorded(spec: RecordedWorkload) -> list[Session]:
    """Sessions of ``spec.path``; with ``session_rate_per_s``, seeded Poisson arrival offsets.

    A session whose first turn already exceeds ``max_context_tokens`` is left out; if that
    leaves none, the spec cannot run and this raises.
    """
    raw = read_recorded(spec.path, spec.format, spec.max_sessions)
    arrivals = random.Random(stable_id("recorded-arrivals", spec.seed))
    sessions: list[Session] = []
    t = 0.0
    for session_id, turns in raw:
        start_s = None
        if spec.session_rate_per_s is not None:
            start_s = t
            t += arrivals.expovariate(spec.session_rate_per_s)
        session = _session(spec, session_id, turns, start_s)
        if session is not None:
            sessions.append(session)
    if not sessions:
        raise TraceError(spec.path, 0, f"no session's first turn fits max_context_tokens {spec.max_context_tokens}")
    return sessions


__all__ = ["CHARS_PER_TOKEN", "estimate_tokens", "load_recorded", "read_recorded"]
