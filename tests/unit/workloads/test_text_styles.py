"""The real-text styles: they tokenize like held-out real text of their kind, keep the prefix
property but for a measured small rate of padded blocks, distinct ids begin differently, and the
text is the same in another process. Plus the corpus' sources and its errors."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import subprocess
import sys
import textwrap
import time

import pytest

from workloads import corpus
from workloads.text import (
    AGENT_MIX,
    TEXT_STYLES,
    TextFactory,
    _pieces,
    reference_text,
    stable_id,
    tokenize_cost_ms_per_1k,
)

REAL = tuple(s for s in TEXT_STYLES if s != "uniform")


@pytest.fixture(params=["qwen3", "llama3"])
def tokenizer_factory(request: pytest.FixtureRequest) -> TextFactory:
    return request.getfixturevalue(f"{request.param}_factory")


# What the styles cost to tokenize against held-out real text of their kind, and against the old uniform
# words, is a speed: benchmarks/text_bench.py prints it (thread CPU time, paired pieces); no test times it.


@pytest.mark.parametrize("style", REAL)
def test_prefix_property_breaks_only_for_few_padded_blocks(tokenizer_factory: TextFactory, style: str) -> None:
    f = TextFactory(tokenizer_factory.tokenizer, style=style)
    rng = random.Random(5)
    broken = 0
    for h in range(600):
        m = rng.randint(2, 2048)
        full, part = f.block(h, m), f.block(h, rng.randint(1, m - 1))
        broken += not full.startswith(part)
    assert f.blocks_made == 1200
    assert broken <= f.blocks_padded  # only a padded block can break the property
    assert f.blocks_padded / f.blocks_made < 0.02


@pytest.mark.parametrize("style", REAL)
def test_distinct_ids_begin_differently(qwen3_factory: TextFactory, style: str) -> None:
    # Equal beginnings for different ids would be prefix-cache hits the trace does not have.
    f = TextFactory(qwen3_factory.tokenizer, style=style, cache_blocks=1)
    beginnings = {f.block(h, 8) for h in range(5000)}
    assert len(beginnings) == 5000


def test_agent_mix_uses_its_weights(qwen3_factory: TextFactory) -> None:
    f = TextFactory(qwen3_factory.tokenizer, style="agent-mix")
    singles = {kind: TextFactory(f.tokenizer, style=kind) for kind in AGENT_MIX}
    counts = dict.fromkeys(AGENT_MIX, 0)
    for h in range(1000):
        text = f.block(h, 64)
        body = text[re.match(r"(?: [a-z]+){2}", text).end():]  # after the id's two words
        kinds = [k for k, g in singles.items() if body in g._tables[k].text]
        if len(kinds) == 1:  # not when the block wraps round the end of its corpus
            counts[kinds[0]] += 1
    assert sum(counts.values()) > 950
    for kind, weight in AGENT_MIX.items():
        assert abs(counts[kind] / sum(counts.values()) - weight) < 0.05, counts


def test_blocks_longer_than_the_corpus_wrap_exactly(qwen3_factory: TextFactory) -> None:
    f = TextFactory(qwen3_factory.tokenizer, style="json")
    n = f._tables["json"].size + 1234  # runs past the end of the corpus, into its start
    text = f.block(3, n)
    assert f.count(text) == n and text.startswith(f.block(3, n - 2000))


def test_same_text_in_another_process(qwen3_factory: TextFactory) -> None:
    plan = [(stable_id("xproc", i), 100 + 37 * i) for i in range(12)]
    script = textwrap.dedent(f"""
        import hashlib, json
        from workloads.text import TEXT_STYLES, TextFactory, bundled_tokenizer_path, load_tokenizer
        tok = load_tokenizer(bundled_tokenizer_path("qwen3"))
        digests = {{s: hashlib.sha256(TextFactory(tok, style=s).render({plan!r}).encode()).hexdigest()
                   for s in TEXT_STYLES}}
        print(json.dumps({{"digests": digests}}))
        """)
    env = {**os.environ, "RAYON_NUM_THREADS": "1", "PYTHONHASHSEED": "12345"}  # one thread, another hash seed
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                         timeout=50, check=True).stdout
    got = json.loads(out)
    for style in TEXT_STYLES:
        ours = TextFactory(qwen3_factory.tokenizer, style=style).render(plan)
        assert got["digests"][style] == hashlib.sha256(ours.encode()).hexdigest(), style
    # How long the first factory takes to build: benchmarks/text_bench.py prints it ("build").


def test_reference_is_held_out() -> None:
    for kind in corpus.KINDS:
        draw, ref = corpus.draw_text(kind), corpus.reference_text(kind)
        assert len(draw) > 150_000 and len(ref) > 150_000
        sections = ref.split("\n\n")
        long = [s for s in sections if len(s) > 1500][:20]  # long sections are not boilerplate
        assert long and not any(s in draw for s in long)


def test_missing_stdlib_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setattr(corpus.sysconfig, "get_paths", lambda: {"stdlib": str(tmp_path)})
    with pytest.raises(corpus.CorpusError, match="standard library"):
        corpus._code_documents()


def test_unknown_kind_and_uniform_reference_rejected(qwen3_factory: TextFactory) -> None:
    with pytest.raises(ValueError, match="corpus kind"):
        corpus.draw_text("poetry")
    with pytest.raises(ValueError, match="no reference"):
        reference_text(qwen3_factory.tokenizer, "uniform", 100)


def test_cost_helper(qwen3_factory: TextFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    # Its units, on a thread clock by which every encode takes 1 ms: each piece's best time, summed, per 1k
    # tokens of the text. (How fast tokenizing is: benchmarks/text_bench.py.)
    text = qwen3_factory.block(1, 3000)
    pieces = len(_pieces(text))
    assert pieces >= 2  # timed in pieces of about 2k tokens
    ticks = iter(range(0, 10**15, 1_000_000))
    monkeypatch.setattr(time, "thread_time_ns", lambda: next(ticks))
    ms = tokenize_cost_ms_per_1k(qwen3_factory.tokenizer, text, repeats=3)
    monkeypatch.undo()
    assert ms == pytest.approx(pieces * 1.0 / 3000 * 1000)
    with pytest.raises(ValueError):
        tokenize_cost_ms_per_1k(qwen3_factory.tokenizer, "")
