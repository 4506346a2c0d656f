"""Greedy agreement of batched and solo decoding on one GGUF: 8 prompts x 32 tokens through
``generate_batch(parallel=8)`` and one at a time, and for each prompt that differs the solo
top-1/top-2 logprob gap at the first divergence (a near-tie is batched rounding, not a bug).

    python benchmarks/batch_agreement.py MODEL.gguf [--threads 1]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from eliza_backends import InferenceContext, generate, generate_batch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from near_ties import divergence_gap

PROMPTS = ["The capital of France is", "Once upon a time, in a small village,",
           "def fibonacci(n):", "The three primary colors are", "Water boils at",
           "My favourite book is", "In 1969, the first humans", "To make a cup of tea, first"]


def first_difference(a: str, b: str) -> int:
    return next(j for j in range(min(len(a), len(b)) + 1) if a[:j + 1] != b[:j + 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    cfg: dict[str, Any] = {"threads": args.threads, "max_tokens": 32, "ignore_eos": True}
    t0 = time.perf_counter()
    batched = generate_batch(args.model, PROMPTS, parallel=len(PROMPTS), backend="llama.cpp",
                             config=cfg)
    t1 = time.perf_counter()
    with InferenceContext(args.model) as ctx:
        solo = [generate(ctx, p, backend="llama.cpp", **cfg) for p in PROMPTS]
    t2 = time.perf_counter()
    texts = [r.text for r in batched.results]
    same = sum(a == b for a, b in zip(texts, solo, strict=True))
    print(f"{args.model}: batched == solo for {same}/{len(PROMPTS)} prompts (batched "
          f"{t1 - t0:.1f} s, solo one after another {t2 - t1:.1f} s; "
          f"batched={batched.stats.batched})")
    for i, (a, b) in enumerate(zip(texts, solo, strict=True)):
        if a != b:
            k = first_difference(a, b)
            gap = divergence_gap(args.model, PROMPTS[i], a, max_tokens=32, config=cfg)
            print(f"  prompt {i} at char {k}: batched {a[k:k + 24]!r}, solo {b[k:k + 24]!r}; "
                  f"solo top-1/top-2 gap there {gap:.4f} nats")


if __name__ == "__main__":
    main()
