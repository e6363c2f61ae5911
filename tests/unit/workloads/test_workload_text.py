"""TextFactory gives exactly N tokens with the real Qwen3 (and, if present, Llama 3) tokenizer."""

from __future__ import annotations

import random

import pytest

from workloads.text import TextFactory, stable_id, token_counter


@pytest.fixture(params=["qwen3", "llama3"])
def factory(request: pytest.FixtureRequest) -> TextFactory:
    return request.getfixturevalue(f"{request.param}_factory")


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


def test_blocks_with_answer_text_in_between_stay_close(qwen3_factory: TextFactory) -> None:
    # Agentic prompts interleave our blocks with model answers; our blocks start with a space,
    # so they never merge with what precedes them.
    answer = " The file has 3 lines.\n"
    text = qwen3_factory.block(1, 100) + answer + qwen3_factory.block(2, 100)
    assert qwen3_factory.count(text) == 200 + qwen3_factory.count(answer)


def test_equal_ids_identical_and_different_ids_differ(qwen3_factory: TextFactory) -> None:
    assert qwen3_factory.block(7, 512) == qwen3_factory.block(7, 512)
    assert qwen3_factory.block(7, 512) != qwen3_factory.block(8, 512)
    # A fresh factory (another process, say) renders the same text: no salted hash() anywhere.
    other = TextFactory(qwen3_factory.tokenizer, cache_blocks=1)
    assert other.block(7, 512) == qwen3_factory.block(7, 512)


def test_partial_block_is_prefix_of_full_block(qwen3_factory: TextFactory) -> None:
    full = qwen3_factory.block(99, 512)
    part = qwen3_factory.block(99, 102)
    assert full.startswith(part) and qwen3_factory.count(part) == 102


def test_text_is_exact_and_seeded(qwen3_factory: TextFactory) -> None:
    a = qwen3_factory.text(1000, seed=3)
    assert qwen3_factory.count(a) == 1000
    assert a == qwen3_factory.text(1000, seed=3) != qwen3_factory.text(1000, seed=4)


def test_negative_count_rejected(qwen3_factory: TextFactory) -> None:
    with pytest.raises(ValueError, match="n_tokens"):
        qwen3_factory.text(-1, seed=0)


def test_pool_is_large_and_single_token(qwen3_factory: TextFactory) -> None:
    assert qwen3_factory.pool_size > 10_000


def test_counter_matches_server_counting_qwen3(qwen3_factory: TextFactory) -> None:
    text = qwen3_factory.block(1, 50)
    assert token_counter(qwen3_factory.tokenizer)(text) == 50  # Qwen3 adds no BOS


def test_counter_includes_special_tokens_llama3(llama3_factory: TextFactory) -> None:
    text = llama3_factory.block(1, 50)
    assert token_counter(llama3_factory.tokenizer)(text) == 51  # Llama 3 adds <|begin_of_text|>


def test_stable_id_is_stable() -> None:
    assert stable_id("block", 1) == stable_id("block", 1) != stable_id("block", 2)
    assert stable_id("block", 1) == 6877789800291950598  # pinned: changing it changes every prompt
