"""TextFactory gives exactly N tokens with the real Qwen3 (and, if present, Llama 3) tokenizer,
in every text style. Properties of the styles themselves (cost, prefix rate, processes) are in
test_text_styles.py."""

from __future__ import annotations

import random

import pytest

from workloads.text import TEXT_STYLES, TextFactory, stable_id, token_counter

_FACTORIES: dict[tuple[str, str], TextFactory] = {}


def _styled(request: pytest.FixtureRequest, tokenizer: str, style: str) -> TextFactory:
    # One factory per (tokenizer, style) for the whole module: the uniform pool takes ~0.5 s.
    if (tokenizer, style) not in _FACTORIES:
        base: TextFactory = request.getfixturevalue(f"{tokenizer}_factory")
        _FACTORIES[tokenizer, style] = TextFactory(base.tokenizer, style=style)
    return _FACTORIES[tokenizer, style]


@pytest.fixture(params=[(t, s) for t in ("qwen3", "llama3") for s in TEXT_STYLES],
                ids=lambda p: f"{p[0]}-{p[1]}")
def factory(request: pytest.FixtureRequest) -> TextFactory:
    return _styled(request, *request.param)


@pytest.fixture(params=TEXT_STYLES)
def qwen3_styled(request: pytest.FixtureRequest) -> TextFactory:
    return _styled(request, "qwen3", request.param)


@pytest.mark.parametrize("n", [0, 1, 2, 7, 511, 512, 513, 4096])
def test_block_has_exact_token_count(factory: TextFactory, n: int) -> None:
    assert factory.count(factory.block(12345, n)) == n


def test_concatenated_blocks_stay_exact(factory: TextFactory) -> None:
    rng = random.Random(1)
    for _ in range(20):
        plan = [(rng.randrange(200_000), rng.randint(1, 700)) for _ in range(rng.randint(1, 30))]
        text = factory.render(plan)
        assert factory.count(text) == sum(n for _, n in plan)


def test_long_context_is_exact(factory: TextFactory) -> None:
    plan = [(i, 512) for i in range(128)]  # 64k tokens, the long end of agentic contexts
    assert factory.count(factory.render(plan)) == 65_536


def test_blocks_with_answer_text_in_between_stay_exact(qwen3_styled: TextFactory) -> None:
    # Agentic prompts interleave our blocks with model answers; our blocks start with a space
    # and a letter or punctuation mark, so they never merge with what precedes them.
    f = qwen3_styled
    answer = " The file has 3 lines.\n"
    for h in range(20):
        text = f.block(2 * h, 100) + answer + f.block(2 * h + 1, 100)
        assert f.count(text) == 200 + f.count(answer)


@pytest.mark.parametrize("answer", ["The file has 3 lines.", "\n\nDone.\n\n", "```\nok\n```", "42", "\t"])
def test_blocks_with_other_answers_stay_close(qwen3_styled: TextFactory, answer: str) -> None:
    # An answer that does not start with a space can merge with the end of the block before
    # it, and one ending in newlines with the end of its own text: one token per junction at most.
    f = qwen3_styled
    for h in range(20):
        text = f.block(2 * h, 100) + answer + f.block(2 * h + 1, 100)
        assert abs(f.count(text) - (200 + f.count(answer))) <= 2


def test_equal_ids_identical_and_different_ids_differ(qwen3_styled: TextFactory) -> None:
    f = qwen3_styled
    assert f.block(7, 512) == f.block(7, 512)
    assert f.block(7, 512) != f.block(8, 512)
    # A fresh factory (another process, say) renders the same text: no salted hash() anywhere.
    other = TextFactory(f.tokenizer, style=f.style, cache_blocks=1)
    assert other.block(7, 512) == f.block(7, 512)


def test_partial_block_is_prefix_of_full_block(qwen3_styled: TextFactory) -> None:
    f = qwen3_styled
    full = f.block(99, 512)
    part = f.block(99, 102)
    assert full.startswith(part) and f.count(part) == 102


def test_text_is_exact_and_seeded(qwen3_styled: TextFactory) -> None:
    f = qwen3_styled
    a = f.text(1000, seed=3)
    assert f.count(a) == 1000
    assert a == f.text(1000, seed=3) != f.text(1000, seed=4)
    assert f.text(1000, seed=3).startswith(f.text(600, seed=3))


def test_negative_count_rejected(qwen3_styled: TextFactory) -> None:
    with pytest.raises(ValueError, match="n_tokens"):
        qwen3_styled.text(-1, seed=0)
    with pytest.raises(ValueError, match="n_tokens"):
        qwen3_styled.block(1, -1)


def test_unknown_style_rejected(qwen3_factory: TextFactory) -> None:
    with pytest.raises(ValueError, match="text style"):
        TextFactory(qwen3_factory.tokenizer, style="lorem")


def test_default_style_is_agent_mix(qwen3_factory: TextFactory) -> None:
    assert qwen3_factory.style == "agent-mix"


def test_pool_is_large(qwen3_styled: TextFactory) -> None:
    # Single-token words (uniform) or distinct places a block can begin (real-text styles).
    assert qwen3_styled.pool_size > 10_000


def test_counter_matches_server_counting_qwen3(qwen3_factory: TextFactory) -> None:
    text = qwen3_factory.block(1, 50)
    assert token_counter(qwen3_factory.tokenizer)(text) == 50  # Qwen3 adds no BOS


def test_counter_includes_special_tokens_llama3(llama3_factory: TextFactory) -> None:
    text = llama3_factory.block(1, 50)
    assert token_counter(llama3_factory.tokenizer)(text) == 51  # Llama 3 adds <|begin_of_text|>


def test_stable_id_is_stable() -> None:
    assert stable_id("block", 1) == stable_id("block", 1) != stable_id("block", 2)
    assert stable_id("block", 1) == 6877789800291950598  # pinned: changing it changes every prompt
