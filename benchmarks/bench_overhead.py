"""The seam's per-token cost on llama.cpp, in one process, on one context: ``Session.next``
(1 and 16 tokens per call) against the bare ctypes loop (decode + greedy sample) driving the
same ``llama_context``, interleaved with rotation (``benchmarks/harness.py``), so model,
position and machine state are identical.

    python benchmarks/bench_overhead.py [--tokens 200] [--repeat 15]

On the 0.5 M-parameter tiny model a token costs ~150 µs, so this isolates the Python work the
seam adds per token (locking, checks, text assembly, ``Step``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from harness import TINY, interleave

from eliza_backends import open_stream


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    import llama_cpp as lc

    n = args.tokens
    with open_stream(TINY, backend="llama.cpp", threads=args.threads, context_size=1024,
                     max_tokens=10 * n, ignore_eos=True) as stream:
        s: Any = stream.session
        prompt = [0, 43, 289, 87, 269]

        def seam(step: int) -> float:
            s.reset()
            s.prefill(prompt)
            t0 = time.perf_counter()
            for _ in range(n // step):
                s.next(step)
            return (time.perf_counter() - t0) / n

        def raw() -> float:
            s.reset()
            s.prefill(prompt)
            s.next(1)
            ctx, smpl, one = s._ctx, s._sampler, s._one
            pos, tok = s._cursor.n_kv, s._cursor.pending[0]
            t0 = time.perf_counter()
            for _ in range(n - 1):
                one.token[0] = tok
                one.pos[0] = pos
                lc.llama_decode(ctx, one)
                pos += 1
                tok = lc.llama_sampler_sample(smpl, ctx, -1)
            dt = (time.perf_counter() - t0) / (n - 1)
            s._cursor.n_kv, s._cursor.pending = pos, [tok]
            return dt

        runners = {"raw loop": raw, "seam next(1)": lambda: seam(1),
                   "seam next(16)": lambda: seam(16)}
        results = interleave(list(runners), args.repeat, lambda name: runners[name]())
    base = statistics.median(results["raw loop"])
    for name, values in results.items():
        med = statistics.median(values)
        print(f"{name:<14} {1e6 * med:7.1f} us/token  {1 / med:8.0f} tok/s  "
              f"x{base / med:.3f} of the raw loop")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
