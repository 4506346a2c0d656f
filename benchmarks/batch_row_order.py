"""What the order of a batch's rows costs ``llama_decode`` (issue 39): one step of N decode tokens,
one per sequence, with the rows in sequence-id order, in a shuffled (arrival-like) order and in
reverse, on a context with one KV cache per sequence (``kv_unified=false``, as ``serve
--parallel N`` and llama-server ``-np N``) and on one unified cache; median ms per step over the
steps after a 32-token prompt per sequence, rounds interleaved.

llama.cpp cuts a batch over per-sequence caches into one ubatch per run of consecutive increasing
sequence ids (``llama_batch_allocr::split_equal``, sequential), so the order decides how many
passes over the weights a step makes; a unified cache takes the batch as it comes
(``split_simple``). ``eliza_llamacpp.batch_engine`` lays its steps out in id order.

    python benchmarks/batch_row_order.py MODEL.gguf [--parallel 8] [--threads 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import random
import statistics
import time
from typing import Any

import llama_cpp as lc

PROMPT = 32
STEPS = 48
SKIP = 4


@lc.llama_log_callback  # type: ignore[untyped-decorator]
def _quiet(level: int, text: bytes, user: ctypes.c_void_p) -> None:
    pass


def step_ms(model: Any, order: list[int], unified: bool, threads: int) -> float:
    """Median ms of one ``llama_decode`` of ``len(order)`` decode rows laid out in ``order``."""
    n = len(order)
    params = lc.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch = 2048 * n, 512, 512
    params.n_seq_max, params.kv_unified = n, unified
    params.n_threads = params.n_threads_batch = threads
    ctx = lc.llama_init_from_model(model, params)
    batch = lc.llama_batch_init(512, 0, 1)
    for seq in range(n):  # each sequence's prompt alone
        for j in range(PROMPT):
            batch.token[j], batch.pos[j], batch.n_seq_id[j] = 1000 + seq + j, j, 1
            batch.seq_id[j][0], batch.logits[j] = seq, j == PROMPT - 1
        batch.n_tokens = PROMPT
        lc.llama_decode(ctx, batch)
    times = []
    for k in range(STEPS):
        for row, seq in enumerate(order):
            batch.token[row], batch.pos[row], batch.n_seq_id[row] = 2000 + k, PROMPT + k, 1
            batch.seq_id[row][0], batch.logits[row] = seq, 1
        batch.n_tokens = n
        start = time.perf_counter()
        lc.llama_decode(ctx, batch)
        times.append(time.perf_counter() - start)
    lc.llama_batch_free(batch)
    lc.llama_free(ctx)
    return statistics.median(times[SKIP:]) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    lc.llama_log_set(_quiet, ctypes.c_void_p(0))
    lc.llama_backend_init()
    model = lc.llama_model_load_from_file(args.model.encode(), lc.llama_model_default_params())
    ids = list(range(args.parallel))
    shuffled = random.Random(0).sample(ids, len(ids))
    orders = {"id order": ids, f"shuffled {shuffled}": shuffled, "reversed": ids[::-1]}
    rows: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for unified in (False, True):
            for name, order in orders.items():
                key = f"{'unified cache' if unified else 'per-sequence caches'}, {name}"
                rows.setdefault(key, []).append(step_ms(model, order, unified, args.threads))
    lc.llama_model_free(model)
    print(f"{os.path.basename(args.model)}: one step of {args.parallel} decode rows, --threads "
          f"{args.threads}, load average {os.getloadavg()[0]:.1f}")
    for key, values in rows.items():
        print(f"  {key}: {statistics.median(values):.1f} ms/step "
              f"(rounds {', '.join(f'{v:.1f}' for v in values)})")


if __name__ == "__main__":
    main()
