"""Per-request records: the raw facts of what happened, one immutable record per request.

Records hold only facts observed by the client (monotonic-ns timestamps, token counts,
status). Every latency or throughput figure is derived later by the pure functions in
``workloads.metrics``, so a record written to Parquet today can be re-analysed with a
different metric definition tomorrow.

Terms: a *session* is one conversation; a *turn* is one request inside it (``turn`` counts
from 0). Timestamps come from ``time.monotonic_ns()`` of the client process, so they are
only comparable with each other, never with wall-clock time or with another host.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Literal

import pandas as pd

Status = Literal["ok", "timeout", "error", "cut"]
STATUSES: tuple[Status, ...] = ("ok", "timeout", "error", "cut")


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What happened to one request.

    Status meanings:
      * ``ok``: the stream ended with ``data: [DONE]``.
      * ``timeout``: the per-request deadline passed before the stream ended.
      * ``error``: connection refused/reset, HTTP status >= 400, an error event, or a stream that
        was unparsable or ended without ``[DONE]``.
      * ``cut``: the measurement window's drain period ended while the request was in flight.

    ``token_ns`` holds one arrival time per generated token. A streamed chunk may carry
    several tokens; their individual arrival times are unknowable on the client, so every
    token of a chunk gets that chunk's arrival time (inter-token gaps inside a chunk are 0).
    """

    request_id: str
    session_id: str
    turn: int
    scheduled_ns: int  # when the strategy wanted the request sent
    sent_ns: int  # just before the HTTP request was written
    first_token_ns: int | None  # arrival of the first chunk carrying a token
    token_ns: tuple[int, ...]
    end_ns: int  # stream end, deadline, error or cut
    prompt_tokens: int  # server usage.prompt_tokens, else client_prompt_tokens
    completion_tokens: int  # server usage.completion_tokens, else len(token_ns)
    cached_tokens: int | None  # usage.prompt_tokens_details.cached_tokens, None if not reported
    client_prompt_tokens: int  # client-side count (tokenizer, or the loader's plan)
    tokenize_ns: int  # client-side tokenization time of the prompt; 0 = not measured
    status: Status
    error: str | None = None
    recorded_prompt_tokens: int | None = None
    response_schema: str | None = None  # the tool whose arguments the answer was constrained to (structured output)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")


_FIELDS = tuple(f.name for f in fields(RequestRecord))
# Explicit Arrow-friendly dtypes: nullable integers keep None distinct from 0 after a
# Parquet round trip, and plain ``object`` columns of Python ints would not survive it.
_INT_COLUMNS = ("turn", "scheduled_ns", "sent_ns", "end_ns", "prompt_tokens", "completion_tokens",
                "client_prompt_tokens", "tokenize_ns")
_NULLABLE_INT_COLUMNS = ("first_token_ns", "cached_tokens", "recorded_prompt_tokens")
# Columns added after records were first written: frames (Parquet files) from before lack
# them, and read back with the field's default.
_OPTIONAL_COLUMNS = ("recorded_prompt_tokens", "response_schema")


def records_to_frame(records: Iterable[RequestRecord]) -> pd.DataFrame:
    """One row per record; ``token_ns`` becomes a list column (Parquet ``list<int64>``)."""
    rows = [{name: getattr(r, name) for name in _FIELDS} for r in records]
    frame = pd.DataFrame(rows, columns=list(_FIELDS))
    frame["token_ns"] = [list(r["token_ns"]) for r in rows]
    for col in _INT_COLUMNS:
        frame[col] = frame[col].astype("int64")
    for col in _NULLABLE_INT_COLUMNS:  # from the values themselves: through float64 a None made ns timestamps inexact
        frame[col] = pd.array([r[col] for r in rows], dtype="Int64")
    for col in ("request_id", "session_id", "status"):
        frame[col] = frame[col].astype("string")
    for col in ("error", "response_schema"):
        frame[col] = frame[col].astype("string")
    return frame


def _opt_int(value: object) -> int | None:
    return None if value is None or pd.isna(value) else int(value)  # type: ignore[call-overload]


def _opt_str(value: object) -> str | None:
    return None if value is None or pd.isna(value) else str(value)  # type: ignore[arg-type]


def frame_to_records(frame: pd.DataFrame) -> list[RequestRecord]:
    """Inverse of :func:`records_to_frame` (also after a Parquet round trip)."""
    missing = set(_FIELDS) - set(frame.columns) - set(_OPTIONAL_COLUMNS)
    if missing:
        raise ValueError(f"frame lacks record columns: {sorted(missing)}")
    out: list[RequestRecord] = []
    for row in frame.to_dict("records"):
        out.append(RequestRecord(
            request_id=str(row["request_id"]),
            session_id=str(row["session_id"]),
            turn=int(row["turn"]),
            scheduled_ns=int(row["scheduled_ns"]),
            sent_ns=int(row["sent_ns"]),
            first_token_ns=_opt_int(row["first_token_ns"]),
            token_ns=tuple(int(t) for t in row["token_ns"]),
            end_ns=int(row["end_ns"]),
            prompt_tokens=int(row["prompt_tokens"]),
            completion_tokens=int(row["completion_tokens"]),
            cached_tokens=_opt_int(row["cached_tokens"]),
            client_prompt_tokens=int(row["client_prompt_tokens"]),
            tokenize_ns=int(row["tokenize_ns"]),
            status=str(row["status"]),  # type: ignore[arg-type]
            error=_opt_str(row["error"]),
            recorded_prompt_tokens=_opt_int(row.get("recorded_prompt_tokens")),
            response_schema=_opt_str(row.get("response_schema")),
        ))
    return out


__all__ = ["STATUSES", "RequestRecord", "Status", "frame_to_records", "records_to_frame"]
