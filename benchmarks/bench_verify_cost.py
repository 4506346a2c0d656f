"""What batched verification can give on this CPU: the cost of one llama_decode over n tokens
(n = 1 + draft length) relative to one single-token decode, on the same model and context.

    python benchmarks/bench_verify_cost.py [--model q4_0] [--threads 2]

With acceptance a (accepted drafts per round) a round produces a + 1 tokens for the price of
one batched decode (plus drafting), so the speed-up bound is (a + 1) / cost(n). Prints that
bound for perfect acceptance (a = n - 1).
"""

from __future__ import annotations

import argparse
import time

from bench_llamacpp import model_bundle
from harness import summarize

from eliza_backends import open_stream


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="q4_0")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args(argv)
    import llama_cpp as lc

    with open_stream(model_bundle(args.model), backend="llama.cpp", threads=args.threads,
                     context_size=1024) as stream:
        s = stream.session
        ids = s.tokenize("The river ran past the old mill and the wheel turned all day. " * 8)
        s.prefill(ids[:200])
        ctx, batch, base = s._ctx, s._batch, s._cursor.n_kv  # type: ignore[attr-defined]
        mem = lc.llama_get_memory(ctx)
        cost: dict[int, float] = {}
        for n in (1, 2, 3, 5, 9):
            times = []
            for _ in range(args.repeat):
                for i in range(n):
                    batch.token[i], batch.pos[i], batch.n_seq_id[i] = ids[i], base + i, 1
                    batch.seq_id[i][0], batch.logits[i] = 0, 1
                batch.n_tokens = n
                t0 = time.perf_counter()
                assert lc.llama_decode(ctx, batch) == 0
                times.append(time.perf_counter() - t0)
                lc.llama_memory_seq_rm(mem, 0, base, -1)
            cost[n] = (summarize(times) or {"median": 0.0})["median"]
    one = cost[1]
    print(f"{args.model}, {args.threads} threads: one decode over n tokens, relative to n=1")
    for n, t in cost.items():
        print(f"  n={n}: {1000 * t:7.1f} ms  x{t / one:.2f}  -> bound with every draft "
              f"accepted: x{n / (t / one):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
