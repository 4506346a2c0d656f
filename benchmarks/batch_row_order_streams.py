"""8 concurrent greedy streams on one ``parallel=8`` context with the steps laid out by sequence id
(``StepScheduler.rows_by_sequence``, the engine's default) and in arrival order (the layout
before), toggled on the same scheduler round by round (interleaved, so a load swing hits both);
aggregate tokens/s per layout, medians after 2 warm-up rounds. The kernel side of the same
question is benchmarks/batch_row_order.py.

    python benchmarks/batch_row_order_streams.py MODEL.gguf [--rounds 8] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from typing import Any

from eliza_backends import InferenceContext, open_stream
from eliza_backends.backend import StepScheduler

STREAMS = 8
TOKENS = 48
WARM = 2


def burst(ctx: InferenceContext, config: dict[str, Any],
          found: list[StepScheduler]) -> float:
    """One burst of ``STREAMS`` streams of ``TOKENS`` tokens; returns aggregate tokens/s."""
    done: list[int] = []

    def run(i: int) -> None:
        with open_stream(ctx, **config) as stream:
            stream.prefill(f"Tell me about the sea number {i}. " * 3)
            done.append(sum(1 for _ in stream))
            scheduler = getattr(stream.session, "scheduler", None)
            if not found and isinstance(scheduler, StepScheduler):
                found.append(scheduler)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(STREAMS)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    config = {"backend": "llama.cpp", "max_tokens": TOKENS, "ignore_eos": True,
              "threads": args.threads, "context_size": 2048}
    rates: dict[bool, list[float]] = {True: [], False: []}
    found: list[StepScheduler] = []
    with InferenceContext(args.model, parallel=STREAMS) as ctx:
        for r in range(args.rounds):
            by_id = r % 2 == 0
            if found:
                found[0].rows_by_sequence = by_id
            rate = burst(ctx, config, found)
            if r >= WARM and found:
                rates[by_id].append(rate)
    print(f"{os.path.basename(args.model)}: {STREAMS} streams x {TOKENS} tokens, --threads "
          f"{args.threads}, load average {os.getloadavg()[0]:.1f}")
    for by_id, name in ((True, "rows by sequence id"), (False, "rows in arrival order")):
        values = rates[by_id]
        if values:
            print(f"  {name}: {statistics.median(values):.1f} tok/s "
                  f"(rounds {', '.join(f'{v:.1f}' for v in values)})")


if __name__ == "__main__":
    main()
