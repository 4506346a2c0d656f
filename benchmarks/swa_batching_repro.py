"""A sliding-window model's greedy reply on a batched llama.cpp context vs alone (text only).

    python benchmarks/swa_batching_repro.py [--bundle examples/bundles/gemma4-mm-tiny] [--runs 8]

Three ~300-token prompts decoded at once on ``InferenceContext(parallel=3)`` (one unified KV
cache), each compared with its reply from a session of its own. On gemma4-mm-tiny (Gemma 4,
32-token sliding window) one of them leaves its solo reply at a clear winner (a 0.86-nat gap at
the solo step) in most runs here: a batched-engine issue with sliding-window models, seen first
with images and audio (tests/test_multimodal_*.py mark those concurrency tests as known-flaky
with it). ``kv_unified=False`` would separate the sequences' caches, but llama.cpp's
``seq_cp`` (the engine's prefix sharing) asserts on a non-unified cache.
"""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor

from eliza_backends import InferenceContext, Stream, open_stream

CONFIG = {"backend": "llama.cpp", "max_tokens": 40, "ignore_eos": True, "context_size": 512,
          "batch_size": 256}
TEXTS = ["Tell me a long story about a lighthouse keeper and the ships. " * 9,
         "Name three colors and describe the sea at night in detail please. " * 8,
         "What is the capital of France and why is it famous for bread? " * 10]


def reply(stream: Stream, text: str) -> list[int]:
    stream.reset()
    stream.prefill(text)
    return [t for step in stream for t in step.tokens]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", default="examples/bundles/gemma4-mm-tiny")
    ap.add_argument("--runs", type=int, default=8)
    args = ap.parse_args()
    with open_stream(args.bundle, **CONFIG) as solo:  # type: ignore[arg-type]
        want = [reply(solo, t) for t in TEXTS]
    diverged = 0
    for run in range(args.runs):
        with InferenceContext(args.bundle, parallel=3) as ctx:
            streams = [open_stream(ctx, **CONFIG) for _ in TEXTS]  # type: ignore[arg-type]
            with ThreadPoolExecutor(len(TEXTS)) as pool:
                got = list(pool.map(reply, streams, TEXTS))
            for s in streams:
                s.close()
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            at = next((k for k, (a, b) in enumerate(zip(g, w, strict=False)) if a != b), None)
            if at is not None:
                diverged += 1
                print(f"run {run}: prompt {i} leaves its solo reply at token {at}")
    print(f"{diverged} of {args.runs * len(TEXTS)} batched replies left their solo reply")


if __name__ == "__main__":
    main()
