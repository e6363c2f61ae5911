"""Replay fidelity: the prefix-cache hit rate the replayed requests *would* get, beside the measured one.

Why: vLLM's measured hit rate (``cached_tokens`` per response, or ``vllm:prefix_cache_hits``)
mixes three things: how much of each prompt was sent before (the workload), whether those
blocks were computed yet when the request arrived (concurrency), and whether they were still
in the cache (eviction, block alignment). A Mooncake replay under concurrency measured 52%
against an ideal 59%; without the two ideals below nobody can say which of the last two
caused the gap. Everything here is pure: a function of what was sent and when.

Terms:
  * A *segment* ``(key, tokens)`` is a piece of a prompt. Equal keys mean byte-identical
    text, and the text of ``(key, n)`` is a prefix of the text of ``(key, m)`` for ``n < m``
    (``TextFactory.block`` has that property), so two segments with one key share
    ``min(n, m)`` tokens. Blocks are keyed ``("b", hash_id)``; a session's real answer to
    turn j is keyed ``("a", request_id)`` (unique: no other session contains it).
  * A prompt's *shared prefix* ``L`` is the longest token prefix it has in common with any
    cached sequence. vLLM reuses whole blocks of ``block_size`` tokens and always recomputes
    the last prompt token (``max_cache_hit_length = num_tokens - 1`` in its KV cache
    manager), so the cached tokens of a prompt of ``P`` tokens are
    ``cached = min(floor(L / B) * B, floor((P - 1) / B) * B)``.
  * hit rate ``= sum(cached) / sum(P)`` over ok requests (every sent request still fills
    the cache, whatever its status).

Two ideals, both with an unbounded cache:
  * ``ideal_unbounded_hit_rate``: a request's sequence is cached the moment it is sent, so
    every request reuses everything sent before it (ties in send time: in input order).
  * ``ideal_after_prefill_hit_rate``: a request's prompt blocks become reusable only at its
    first token, and its answer's blocks at its end, so concurrent arrivals of one prefix
    all miss it, as in a real server. (vLLM V1 registers a prompt's block hashes when its
    prefill is *scheduled*, slightly before the first token, so the real server may sit a
    little above this bound.)

vLLM V1 also caches the full blocks of *generated* tokens, so a request's cached sequence is
its prompt followed by its answer (``SentRequest.answer``). The next turn of an agentic
session hits those blocks only if re-tokenizing the answer text gives the generated ids;
where it does not, the shortfall shows up as "eviction or block alignment".

The trie is a radix trie keyed on segments, not on vLLM blocks, so a Mooncake request of 50
trace blocks of 512 tokens costs at most 50 steps whatever ``block_size`` is, and a unique
tail costs one: O(total segments). 100k such requests take about a second.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from .records import RequestRecord
from .trace import Session

Segment = tuple[Hashable, int]  # (key, tokens)

GAP_NOISE = 0.005  # gaps below half a point are reported as "matches"


@dataclass(frozen=True, slots=True)
class SentRequest:
    """What the cache simulation needs of one sent request.

    ``answer``: the generated tokens as a segment (cached after the prompt, as vLLM V1 does),
    or None. ``end_ns``: when the answer was complete (after-prefill ideal: when its blocks
    become reusable; without it the answer is not cached in that variant).
    """

    request_id: str
    sent_ns: int
    first_token_ns: int | None
    status: str
    segments: tuple[Segment, ...]
    answer: Segment | None = None
    end_ns: int | None = None

    @property
    def prompt_tokens(self) -> int:
        return sum(n for _, n in self.segments)


# A radix-trie node is a list, for speed: [label (a run of segments), available_ns,
# children {first segment's key: [node, ...]}, tokens in label]. A request that leaves the
# trie adds its whole remainder as one node, so a unique tail costs one step, not one per
# segment; a later request that diverges inside a label splits it there.
_LABEL, _AVAIL, _KIDS, _TOK = 0, 1, 2, 3


def _tokens(segments: Sequence[Segment]) -> int:
    return sum(n for _, n in segments)


def _split(node: list, j: int) -> None:
    """Cut ``node``'s label after ``j`` segments; the rest becomes its only child."""
    label = node[_LABEL]
    head = _tokens(label[:j])
    rest = [label[j:], node[_AVAIL], node[_KIDS], node[_TOK] - head]
    node[_LABEL], node[_KIDS], node[_TOK] = label[:j], {label[j][0]: [rest]}, head


def _partial(siblings: list | None, seg: Segment, t_ns: int) -> int:
    """Tokens of ``seg`` shared with a reusable sibling that starts with the same key at another length."""
    best = 0
    for child in siblings or ():
        if child[_AVAIL] <= t_ns:
            best = max(best, min(seg[1], child[_LABEL][0][1]))
    return best


def _walk(root: list, segs: Sequence[Segment], t_ns: int, avail: int | None,
          answer: Segment | None, answer_avail: int | None) -> int:
    """Shared-prefix tokens of ``segs`` reusable at ``t_ns``; then insert the request's
    sequence (prompt reusable from ``avail``, answer from ``answer_avail``; None: not inserted).

    Availability only grows down the trie (whoever inserted a node inserted its parent no
    later), so the match stops at the first node not yet reusable.
    """
    segs = tuple(segs)
    node, i, m, matched, matching = root, 0, len(segs), 0, True
    while i < m:
        seg = segs[i]
        siblings = node[_KIDS].get(seg[0])
        child = None
        for c in siblings or ():
            if c[_LABEL][0] == seg:
                child = c
                break
        if matching and (child is None or child[_AVAIL] > t_ns):
            matched += _partial(siblings, seg, t_ns)
            matching = False
        if child is None:
            if avail is None:
                return matched
            new = [segs[i:], avail, {}, _tokens(segs[i:])]
            if siblings is None:
                node[_KIDS][seg[0]] = [new]
            else:
                siblings.append(new)
            node, i = new, m
            break
        label = child[_LABEL]
        n_label = len(label)
        if segs[i:i + n_label] == label:
            j = n_label
        else:
            j, lim = 1, min(n_label, m - i)
            while j < lim and label[j] == segs[i + j]:
                j += 1
        if matching:  # child is reusable
            matched += child[_TOK] if j == n_label else _tokens(label[:j])
            if j < n_label and i + j < m:
                nxt = segs[i + j]
                if label[j][0] == nxt[0]:
                    matched += min(nxt[1], label[j][1])
                matching = False
        if avail is None:
            if not matching or j < n_label:
                return matched
        else:
            if j < n_label:
                _split(child, j)
            if avail < child[_AVAIL]:
                child[_AVAIL] = avail
        node, i = child, i + j
    if avail is not None and answer is not None and answer_avail is not None and answer[1] > 0:
        siblings = node[_KIDS].setdefault(answer[0], [])
        for c in siblings:
            if c[_LABEL][0] == answer:
                if len(c[_LABEL]) > 1:
                    _split(c, 1)
                c[_AVAIL] = min(c[_AVAIL], answer_avail)
                break
        else:
            siblings.append([(answer,), answer_avail, {}, answer[1]])
    return matched


def cached_tokens(shared: int, prompt_tokens: int, block_size: int) -> int:
    """``min(floor(shared / B) * B, floor((P - 1) / B) * B)``: whole blocks, never the last token."""
    if prompt_tokens < 1:
        return 0
    return min(shared // block_size, (prompt_tokens - 1) // block_size) * block_size


def ideal_hits(requests: Sequence[SentRequest], block_size: int, *, after_prefill: bool = False) -> list[int]:
    """Cached tokens per request (input order) with an unbounded cache at ``block_size``.

    Requests are replayed in send order. ``after_prefill=False``: a request's sequence is
    reusable from its send time (by every request sent at or after it, later in input order
    on ties). ``after_prefill=True``: its prompt is reusable from ``first_token_ns`` (not at
    all without a first token) and its answer from ``end_ns``, by requests sent at or after.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    order = sorted(range(len(requests)), key=lambda i: requests[i].sent_ns)  # stable: ties keep input order
    root: list = [(), -math.inf, {}, 0]
    out = [0] * len(requests)
    # The trie makes no reference cycles, but its millions of new lists would trigger full
    # collections that traverse the caller's whole heap (twice the run time at 100k requests).
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for i in order:
            r = requests[i]
            if after_prefill:
                avail, answer_avail = r.first_token_ns, r.end_ns
            else:
                avail = answer_avail = r.sent_ns
            shared = _walk(root, r.segments, r.sent_ns, avail, r.answer, answer_avail)
            out[i] = cached_tokens(shared, r.prompt_tokens, block_size)
    finally:
        if was_enabled:
            gc.enable()
    return out


def _rate(requests: Sequence[SentRequest], cached: Sequence[int]) -> float | None:
    """``sum(cached) / sum(prompt_tokens)`` over ok requests; None without ok prompt tokens."""
    hits = total = 0
    for r, c in zip(requests, cached):
        if r.status == "ok":
            hits += c
            total += r.prompt_tokens
    return hits / total if total else None


def ideal_unbounded_hit_rate(requests: Sequence[SentRequest], block_size: int) -> float | None:
    """Ideal hit rate, blocks reusable from their send: ``sum(cached) / sum(P)`` over ok requests."""
    return _rate(requests, ideal_hits(requests, block_size))


def ideal_after_prefill_hit_rate(requests: Sequence[SentRequest], block_size: int) -> float | None:
    """Ideal hit rate, blocks reusable from their first token (answers from their end)."""
    return _rate(requests, ideal_hits(requests, block_size, after_prefill=True))


def _blocks_of(turn: object) -> tuple | None:
    """A turn's ``append`` blocks, or None for a turn that carries its text another way."""
    append = getattr(turn, "append", None)
    if not append or not isinstance(append, tuple):
        return None
    if not all(isinstance(b, tuple) and len(b) == 2 for b in append):
        return None
    return append


def segments_for(sessions: Iterable[Session], records: Iterable[RequestRecord], *,
                 cache_answers: bool = True, bos_tokens: int = 0) -> dict[str, tuple[SentRequest, ...] | None]:
    """Each session's sent requests as segment sequences, rebuilt from the loader's plan.

    Turn k's prompt is ``append(0), answer(0), ..., answer(k-1), append(k)``; block
    ``(hash_id, n)`` becomes ``(("b", hash_id), n)`` and the answer of turn j becomes
    ``(("a", f"{session_id}:{j}"), completion_tokens of that record)``. ``bos_tokens``
    prepends that many tokens shared by every prompt (a tokenizer's BOS, which shifts
    vLLM's block boundaries). Sessions without records are left out; a session with a turn
    that has no ``append`` blocks (e.g. chat messages) maps to None: it cannot be rebuilt.
    """
    by_id = {r.request_id: r for r in records}
    lead: tuple[Segment, ...] = ((("bos",), bos_tokens),) if bos_tokens > 0 else ()
    out: dict[str, tuple[SentRequest, ...] | None] = {}
    for session in sessions:
        sid = session.session_id
        if f"{sid}:0" not in by_id:
            continue
        plans = [_blocks_of(t) for t in session.turns]
        if any(p is None for p in plans):
            out[sid] = None
            continue
        sent: list[SentRequest] = []
        context: list[Segment] = list(lead)
        for k, blocks in enumerate(plans):
            record = by_id.get(f"{sid}:{k}")
            if record is None:
                break  # not sent: past the window, or after a failed turn
            context.extend((("b", h), n) for h, n in blocks)  # type: ignore[union-attr]
            answer: Segment = (("a", record.request_id), record.completion_tokens)
            sent.append(SentRequest(
                request_id=record.request_id, sent_ns=record.sent_ns, first_token_ns=record.first_token_ns,
                status=record.status, segments=tuple(context),
                answer=answer if cache_answers else None, end_ns=record.end_ns))
            context.append(answer)
        out[sid] = tuple(sent)
    return out


def known_requests(plan: Mapping[str, tuple[SentRequest, ...] | None]) -> list[SentRequest]:
    """The requests of every session that ``segments_for`` could rebuild."""
    return [r for reqs in plan.values() if reqs for r in reqs]


@dataclass(frozen=True, slots=True)
class ReplayFidelity:
    """MLflow-safe metrics (``[A-Za-z0-9_]`` names, floats) and a one-line diagnosis."""

    metrics: dict[str, float]
    diagnosis: str


def replay_fidelity(measured_hit_rate: float | None, unbounded: float | None,
                    after_prefill: float | None) -> ReplayFidelity:
    """Split the gap between the ideal and the measured hit rate into its two causes.

    ``prefix_hit_gap_concurrency = unbounded - after_prefill``: hits lost because requests
    sharing a prefix arrived before its first holder had produced a token.
    ``prefix_hit_gap_eviction = after_prefill - measured``: hits lost to eviction (a bounded
    cache) or block alignment (re-tokenized answers, BOS). Negative means the server reused
    more than the plan predicts. A metric whose inputs are missing is omitted.
    """
    metrics: dict[str, float] = {}
    if unbounded is not None:
        metrics["ideal_prefix_hit_rate"] = float(unbounded)
    if after_prefill is not None:
        metrics["ideal_prefix_hit_rate_after_prefill"] = float(after_prefill)
    if unbounded is not None and after_prefill is not None:
        metrics["prefix_hit_gap_concurrency"] = float(unbounded - after_prefill)
    if after_prefill is not None and measured_hit_rate is not None:
        metrics["prefix_hit_gap_eviction"] = float(after_prefill - measured_hit_rate)
    return ReplayFidelity(metrics=metrics, diagnosis=_diagnose(measured_hit_rate, unbounded, metrics))


def _pct(x: float) -> str:
    return f"{x * 100:.1f}%"


def _diagnose(measured: float | None, unbounded: float | None, m: Mapping[str, float]) -> str:
    if unbounded is None:
        return "no ideal prefix-cache hit rate: no ok request could be rebuilt from the plan"
    if measured is None:
        return (f"ideal prefix-cache hit rate {_pct(unbounded)}; the server reported no cached tokens "
                "(start vLLM with --enable-prompt-tokens-details)")
    head = f"measured prefix-cache hit rate {_pct(measured)} vs ideal {_pct(unbounded)}"
    conc = m.get("prefix_hit_gap_concurrency", 0.0)
    evic = m.get("prefix_hit_gap_eviction", 0.0)
    if abs(conc) < GAP_NOISE and abs(evic) < GAP_NOISE:
        return head + ": the replay reused what it could"
    parts = [(conc, "concurrent arrivals"), (evic, "eviction or block alignment")]
    (big, big_name), (small, small_name) = sorted(parts, key=lambda p: -p[0])
    text = f"{head}: {big * 100:.1f} points lost to {big_name} (the larger), {small * 100:.1f} to {small_name}"
    if measured > unbounded + GAP_NOISE:
        text += "; the server hit more than the plan allows (shared text the plan does not know of)"
    elif evic < -GAP_NOISE:
        text += ("; the server beat the after-prefill bound: vLLM caches a prompt's blocks as its prefill is "
                 "scheduled, so requests arriving during a prefill still hit")
    return text


__all__ = [
    "ReplayFidelity", "Segment", "SentRequest", "cached_tokens", "ideal_after_prefill_hit_rate", "ideal_hits",
    "ideal_unbounded_hit_rate", "known_requests", "replay_fidelity", "segments_for",
]
