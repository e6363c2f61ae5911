"""Benchmark of the prompt text styles: does our text cost what real text costs to tokenize?

vLLM tokenizes each prompt in one thread per API server, so the CPU time per token of the
prompt text sets the frontend queue (DESIGN.md, "The prompt text decides whether a frontend
queue forms"). For each tokenizer (Qwen3 and, if its file is given with ``--llama3`` or
LLAMA3_TOKENIZER_JSON, or its package is installed, Llama 3) and each text style, this prints:

  * ours: ms per 1k tokens of a render of ``--tokens`` tokens of blocks of ``--block`` tokens
    with random ids: single-threaded ``encode``, thread CPU time, timed in pieces paired with the
    reference's pieces (``workloads.text.compare_cost``), each piece's best of
    ``--repeats`` x ``--rounds`` passes kept;
  * reference: the same for held-out real text of the style's kind that no prompt uses
    (``workloads.text.reference_text``), and the ratio ours / reference;
  * uniform: the old random single-token words, for comparison;
  * build: seconds to build the first factory of the process (corpus read and tokenized),
    and the share of blocks padded (prefix property broken) over ``--blocks`` random blocks.

Run: ``python benchmarks/text_bench.py [--tokens 60000] [--llama3 path/to/tokenizer.json]``.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path

from workloads.text import (
    TEXT_STYLES,
    TextFactory,
    bundled_tokenizer_path,
    compare_cost,
    load_tokenizer,
    reference_text,
    stable_id,
    tokenize_cost_ms_per_1k,
)


def _tokenizers(llama3: str | None) -> dict[str, Path]:
    found = {"qwen3": bundled_tokenizer_path("qwen3")}
    env = llama3 or os.environ.get("LLAMA3_TOKENIZER_JSON")
    found["llama3"] = Path(env) if env else bundled_tokenizer_path("llama3")
    return {name: path for name, path in found.items() if path is not None and path.is_file()}


def _padded_share(factory: TextFactory, blocks: int) -> float:
    rng = random.Random(0)
    for h in range(blocks):
        factory.block(stable_id("bench-pad", h), rng.randint(1, 4096))
    return factory.blocks_padded / max(1, factory.blocks_made)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=60_000, help="tokens of text per measurement")
    ap.add_argument("--block", type=int, default=512, help="tokens per block of our text")
    ap.add_argument("--repeats", type=int, default=5, help="passes per measurement (best kept)")
    ap.add_argument("--rounds", type=int, default=5, help="alternations of ours and reference")
    ap.add_argument("--blocks", type=int, default=2000, help="random blocks for the padded share")
    ap.add_argument("--llama3", help="Llama 3 tokenizer.json (default: LLAMA3_TOKENIZER_JSON or the package)")
    args = ap.parse_args()

    print(f"{'tokenizer':<10} {'style':<10} {'ours':>7} {'ref':>7} {'ratio':>6}  {'padded':>7} {'build s':>8}"
          "   (ms per 1k tokens, thread CPU time)")
    for name, path in _tokenizers(args.llama3).items():
        tok = load_tokenizer(path)
        plan = [(stable_id("bench", i), args.block) for i in range(max(1, args.tokens // args.block))]
        for style in TEXT_STYLES:
            t0 = time.perf_counter()
            factory = TextFactory(tok, style=style)
            build_s = time.perf_counter() - t0
            ours_text = factory.render(plan)
            if style == "uniform":
                ours = tokenize_cost_ms_per_1k(tok, ours_text, args.repeats)
                print(f"{name:<10} {style:<10} {ours:7.2f} {'':>7} {'':>6}  {'':>7} {build_s:8.2f}")
                continue
            ref_text = reference_text(tok, style, args.tokens)
            ours, ref = compare_cost(tok, ours_text, ref_text, rounds=args.rounds * args.repeats)
            padded = _padded_share(factory, args.blocks)
            print(f"{name:<10} {style:<10} {ours:7.2f} {ref:7.2f} {ours / ref:6.3f}  {padded:7.2%} {build_s:8.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
