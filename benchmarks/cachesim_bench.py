"""Speed of the ideal prefix-cache simulation (``workloads.cachesim.ideal_hits``) on a Mooncake-sized replay.

``--requests`` requests of 50 trace blocks of 512 tokens (10 shared by all, 40 unique), one every
microsecond, first token 50 us after the send: the shape the module's docstring promises "about a
second" per 100k requests for. Prints, for both ideals (reusable from the send, and from the first
token), the best of ``--repeats`` runs as seconds and requests per second, and the ratio against two
simple baselines:

  * read: summing every request's prompt tokens, one pass over all the segments (what merely reading
    the input costs);
  * hash chain: the straightforward simulation, a chained hash per segment prefix looked up in and
    added to one set (what vLLM does per block), whole segments only, reusable from the send. Its
    hits must equal ``ideal_hits``' from-send hits here (the script checks). It takes a step per
    segment, where the trie takes one for a request's whole unique tail.

This was a unit test's time bound (``took < 6.0`` s for 100k requests); a wall-clock bound fails on
a shared CI machine, so the figure is printed here instead. Run on a quiet machine:

    python benchmarks/cachesim_bench.py [--requests 100000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gc
import random
import time

from workloads.cachesim import SentRequest, cached_tokens, ideal_hits

SHARED_BLOCKS, UNIQUE_BLOCKS, BLOCK_TOKENS, BLOCK_SIZE = 10, 40, 512, 32


def requests(n: int, seed: int = 0) -> list[SentRequest]:
    rng = random.Random(seed)
    shared = tuple((("b", h), BLOCK_TOKENS) for h in range(SHARED_BLOCKS))
    return [SentRequest(f"r{i}", i * 1000, i * 1000 + 50_000, "ok",
                        shared + tuple((("b", rng.getrandbits(40)), BLOCK_TOKENS) for _ in range(UNIQUE_BLOCKS)))
            for i in range(n)]


def hash_chain_hits(rs: list[SentRequest], block_size: int) -> list[int]:
    """Baseline: every prefix of whole segments as a chained hash, reusable from the send (input order)."""
    seen: set[int] = set()
    out = []
    was_enabled = gc.isenabled()
    gc.disable()  # as ideal_hits does: no full collections over the growing set
    try:
        for r in rs:
            h, shared, matching = 0, 0, True
            for seg in r.segments:
                h = hash((h, seg))
                if matching and h in seen:
                    shared += seg[1]
                else:
                    matching = False
                    seen.add(h)
            out.append(cached_tokens(shared, r.prompt_tokens, block_size))
    finally:
        if was_enabled:
            gc.enable()
    return out


def best_of(repeats: int, fn) -> tuple[float, list[int]]:
    best, result = float("inf"), []
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3, help="runs of each; the best is kept (noise only adds time)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rs = requests(args.requests)
    n = len(rs)
    print(f"{n} requests x {SHARED_BLOCKS + UNIQUE_BLOCKS} blocks of {BLOCK_TOKENS} tokens, block size {BLOCK_SIZE} "
          f"(built in {time.perf_counter() - t0:.2f} s); best of {args.repeats}")
    read_s, _ = best_of(args.repeats, lambda: [r.prompt_tokens for r in rs])
    base_s, base_hits = best_of(args.repeats, lambda: hash_chain_hits(rs, BLOCK_SIZE))
    print(f"  {'':28} {'s':>6}  {'req/s':>10}  {'x read':>7}  {'x hash chain':>12}")
    for name, took in (("baseline: read", read_s), ("baseline: hash chain", base_s)):
        print(f"  {name:28} {took:6.2f}  {n / took:10,.0f}  {took / read_s:7.2f}  {took / base_s:12.2f}")
    for name, after in (("ideal_hits (from send)", False), ("ideal_hits (after prefill)", True)):
        took, hits = best_of(args.repeats, lambda after=after: ideal_hits(rs, BLOCK_SIZE, after_prefill=after))
        print(f"  {name:28} {took:6.2f}  {n / took:10,.0f}  {took / read_s:7.2f}  {took / base_s:12.2f}")
        if not after:
            assert hits == base_hits, "ideal_hits and the baseline disagree on whole-segment prefixes"
        else:
            assert hits[0] == 0 and set(hits[100:]) == {SHARED_BLOCKS * BLOCK_TOKENS}


if __name__ == "__main__":
    main()
