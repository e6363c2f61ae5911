"""Metrics: small pure functions of ``RequestRecord`` sequences, formula in each docstring.

Nothing here measures anything; it only derives figures from the raw facts that
``workloads.records`` keeps, so the definitions can change without re-running a trial.
Latency distributions use *ok* requests only: a timed-out request has no end-to-end
latency, and counting its partial figures would make starved configurations look faster.
Timeouts are reported separately (``timeouts``, ``timeout_rate``).

``summarize`` returns flat, MLflow-safe names (``[A-Za-z0-9_]``). A metric with no data (say,
TTFT when no request succeeded) is omitted rather than NaN: a missing key is unambiguous in
the MLflow UI, and an absent value cannot be mistaken for a measured one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .records import RequestRecord

_NS = 1e9


def ok_records(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """Records with ``status == "ok"``."""
    return [r for r in records if r.status == "ok"]


def ttft_s(records: Sequence[RequestRecord]) -> list[float]:
    """Time to first token per ok request: ``(first_token_ns - sent_ns) / 1e9``.

    Requests that produced no token are skipped.
    """
    return [(r.first_token_ns - r.sent_ns) / _NS for r in ok_records(records) if r.first_token_ns is not None]


def e2e_s(records: Sequence[RequestRecord]) -> list[float]:
    """End-to-end latency per ok request: ``(end_ns - sent_ns) / 1e9``."""
    return [(r.end_ns - r.sent_ns) / _NS for r in ok_records(records)]


def itl_s(records: Sequence[RequestRecord]) -> list[float]:
    """Inter-token latencies, one per token after the first, over all ok requests:
    ``(token_ns[i] - token_ns[i-1]) / 1e9`` for ``i >= 1``.

    Per token, not per chunk: the tokens of a multi-token chunk share its arrival time, so
    they contribute gaps of 0 and the chunk's gap is counted once, for its first token.
    """
    out: list[float] = []
    for r in ok_records(records):
        t = r.token_ns
        out.extend((t[i] - t[i - 1]) / _NS for i in range(1, len(t)))
    return out


def tpot_s(records: Sequence[RequestRecord]) -> list[float]:
    """Time per output token per ok request with at least two tokens:
    ``(end_ns - first_token_ns) / (completion_tokens - 1) / 1e9``.
    """
    return [(r.end_ns - r.first_token_ns) / (r.completion_tokens - 1) / _NS
            for r in ok_records(records)
            if r.first_token_ns is not None and r.completion_tokens > 1]


def dispatch_lag_s(records: Sequence[RequestRecord]) -> list[float]:
    """Client dispatch lag per request (any status): ``(sent_ns - scheduled_ns) / 1e9``.

    Large values mean the client sent later than its schedule: a busy event loop, a
    saturated client core, or a concurrency cap that held the request back.
    """
    return [(r.sent_ns - r.scheduled_ns) / _NS for r in records]


def tokenize_s(records: Sequence[RequestRecord]) -> list[float]:
    """Client-side tokenization time per request where measured: ``tokenize_ns / 1e9``
    (``tokenize_ns == 0`` means not measured)."""
    return [r.tokenize_ns / _NS for r in records if r.tokenize_ns > 0]


def tokenize_ms_per_1k(records: Sequence[RequestRecord]) -> float | None:
    """What the sent prompts cost to tokenize on one client core, per 1k tokens:
    ``sum(tokenize_ns) / 1e6 / (sum(client_prompt_tokens) / 1000)`` over records tokenized on the
    client (``tokenize_ns > 0``); None when none was. The text's cost per token decides whether
    vLLM's one tokenizer thread per API server queues, so trials with other text compare only
    knowing it."""
    timed = [r for r in records if r.tokenize_ns > 0 and r.client_prompt_tokens > 0]
    tokens = sum(r.client_prompt_tokens for r in timed)
    return sum(r.tokenize_ns for r in timed) / 1e6 / (tokens / 1000) if tokens else None


def first_cached_tokens(records: Sequence[RequestRecord]) -> int | None:
    """Cached prompt tokens the server reported for the window's first request served: the fewest among the
    requests sent before any first token came back (the earliest ``sent_ns`` alone when none did). 0 shows
    the window started from an empty prefix cache. Concurrent opening requests reach the server in any order,
    and the one served second finds the first's shared prefix: the earliest sent once read 256 cached tokens
    after a reset. None if unreported or no records."""
    if not records:
        return None
    firsts = [r.first_token_ns for r in records if r.first_token_ns]
    opening = [r for r in records if r.sent_ns <= min(firsts)] if firsts else []
    cached = [r.cached_tokens for r in opening if r.cached_tokens is not None]
    return min(cached) if cached else min(records, key=lambda r: r.sent_ns).cached_tokens


def prompt_tokens_vs_recorded(records: Sequence[RequestRecord]) -> list[float]:
    """Per ok request of a replayed recording: ``prompt_tokens / recorded_prompt_tokens``.

    Requests without a recorded count (or with a recorded 0) are skipped. Near 1 when the
    server's tokenizer and chat template match the recording's; ``prompt_tokens`` is the
    server's ``usage.prompt_tokens`` whenever the server reports usage.
    """
    return [r.prompt_tokens / r.recorded_prompt_tokens for r in ok_records(records)
            if r.recorded_prompt_tokens]


def count_status(records: Sequence[RequestRecord], status: str) -> int:
    """Number of records with the given status."""
    return sum(1 for r in records if r.status == status)


def duration_s(records: Sequence[RequestRecord]) -> float:
    """Run span: ``(max(end_ns) - min(scheduled_ns)) / 1e9``; 0 without records.

    Starting from the first *scheduled* time (not the first send) keeps client lag inside
    the span, so a slow client cannot inflate throughput.
    """
    if not records:
        return 0.0
    return (max(r.end_ns for r in records) - min(r.scheduled_ns for r in records)) / _NS


def goodput_count(records: Sequence[RequestRecord], *, ttft_slo_s: float | None,
                  tpot_slo_s: float | None) -> int:
    """Ok requests meeting every given SLO: ``ttft <= ttft_slo_s`` and ``tpot <= tpot_slo_s``.

    A request without a first token fails a TTFT SLO; one with fewer than two tokens has no
    TPOT and passes a TPOT SLO.
    """
    good = 0
    for r in ok_records(records):
        if ttft_slo_s is not None and (
                r.first_token_ns is None or (r.first_token_ns - r.sent_ns) / _NS > ttft_slo_s):
            continue
        if (tpot_slo_s is not None and r.first_token_ns is not None and r.completion_tokens > 1
                and (r.end_ns - r.first_token_ns) / (r.completion_tokens - 1) / _NS > tpot_slo_s):
            continue
        good += 1
    return good


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100, linear interpolation, numpy's default); None if empty."""
    if not values:
        return None
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def _put_percentiles(out: dict[str, float], name: str, values: Sequence[float],
                     qs: Sequence[int], mean: bool = False) -> None:
    if not values:
        return  # omitted, never NaN (see module docstring)
    arr = np.asarray(values, dtype=np.float64)
    for q, v in zip(qs, np.percentile(arr, qs)):
        out[f"{name}_p{q}_s"] = float(v)
    if mean:
        out[f"{name}_mean_s"] = float(arr.mean())


def summarize(records: Sequence[RequestRecord], *, ttft_slo_s: float | None = None,
              tpot_slo_s: float | None = None) -> dict[str, float]:
    """Flat metric dict for one run (names are MLflow-safe; empty distributions are omitted).

    Counts and totals cover all records; ``prompt_tokens_*``, ``cached_tokens_total`` and
    ``prefix_hit_rate = cached_tokens_total / prompt_tokens_total`` cover ok requests whose
    server reported cached tokens (``prefix_hit_rate`` is omitted if none did).
    Throughputs divide ok requests / their completion tokens by :func:`duration_s`.
    ``goodput_rps`` appears only when an SLO is given.
    ``prompt_tokens_vs_recorded_ratio_mean`` (mean of :func:`prompt_tokens_vs_recorded`)
    appears only for replayed recordings with recorded prompt counts;
    ``client_tokenize_ms_per_1k`` (:func:`tokenize_ms_per_1k`) only where the client tokenized,
    ``window_first_cached_tokens`` (:func:`first_cached_tokens`) only where the server reported it.
    """
    ok = ok_records(records)
    n = len(records)
    out: dict[str, float] = {
        "requests": float(n),
        "ok": float(len(ok)),
        "timeouts": float(count_status(records, "timeout")),
        "errors": float(count_status(records, "error")),
        "cut": float(count_status(records, "cut")),
    }
    if n:
        out["timeout_rate"] = out["timeouts"] / n
    _put_percentiles(out, "ttft", ttft_s(records), (50, 90, 99), mean=True)
    _put_percentiles(out, "e2e", e2e_s(records), (50, 90, 99))
    _put_percentiles(out, "itl", itl_s(records), (50, 90, 99))
    _put_percentiles(out, "tpot", tpot_s(records), (50, 90))
    _put_percentiles(out, "dispatch_lag", dispatch_lag_s(records), (50, 99))
    _put_percentiles(out, "tokenize", tokenize_s(records), (50,))

    if ok:
        prompt = [r.prompt_tokens for r in ok]
        out["prompt_tokens_mean"] = float(np.mean(prompt))
        out["prompt_tokens_total"] = float(sum(prompt))
        out["completion_tokens_total"] = float(sum(r.completion_tokens for r in ok))
        reported = [r for r in ok if r.cached_tokens is not None]
        if reported:
            cached = sum(r.cached_tokens or 0 for r in reported)
            out["cached_tokens_total"] = float(cached)
            denom = sum(r.prompt_tokens for r in reported)
            if denom:
                out["prefix_hit_rate"] = cached / denom

    cost = tokenize_ms_per_1k(records)
    if cost is not None:
        out["client_tokenize_ms_per_1k"] = cost
    first = first_cached_tokens(records)
    if first is not None:
        out["window_first_cached_tokens"] = float(first)

    ratios = prompt_tokens_vs_recorded(records)
    if ratios:
        out["prompt_tokens_vs_recorded_ratio_mean"] = float(np.mean(ratios))

    span = duration_s(records)
    if span > 0:
        out["duration_s"] = span
        out["request_throughput_rps"] = len(ok) / span
        out["output_throughput_tps"] = sum(r.completion_tokens for r in ok) / span
        if ttft_slo_s is not None or tpot_slo_s is not None:
            out["goodput_rps"] = goodput_count(records, ttft_slo_s=ttft_slo_s, tpot_slo_s=tpot_slo_s) / span
    return out


__all__ = [
    "count_status", "dispatch_lag_s", "duration_s", "e2e_s", "goodput_count", "itl_s", "ok_records",
    "percentile", "prompt_tokens_vs_recorded", "summarize", "tokenize_s", "tpot_s", "ttft_s",
]
