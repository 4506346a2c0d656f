"""MLX continuous batching in process: N concurrent streams on one ``parallel=max(N, 2)`` context
(one batched forward per step, :mod:`eliza_mlx.batch_engine`) vs N independent sessions on a
``parallel=1`` context (each its own prompt cache; the weights loaded once), in one run.

    python benchmarks/bench_mlx_batching.py [--bundle DIR] [--n 1,2,4,8] [--prompt 64]
                                            [--gen 48] [--rounds 2] [--json]

Each stream runs on its own thread (as the server gives each request a worker): prefill of a
``--prompt``-token prompt (a different one per stream), then ``next()`` one token at a time,
greedy, ``--gen`` tokens, eos ignored. Aggregate decode tok/s = N * gen / (the time from the
moment every stream finished its prefill to the last stream's last token). The two modes run
interleaved per round (the order rotates) so the machine's load hits both; the table shows the
median over rounds and the batched / independent ratio, plus the mean rows per batched forward.

Default bundle: the tiny bundle; ``--bundle ~/.cache/eliza-backends/bundles/smollm2`` for
SmolLM2-135M's f32 MLX conversion (``tests/real/models.py`` makes it). Say the load (``uptime``)
next to the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from eliza_backends import InferenceContext, open_stream

ROOT = Path(__file__).resolve().parent.parent


def run_mode(bundle: Path, n: int, prompt: int, gen: int, batched: bool) -> dict[str, Any]:
    """One round of one mode: aggregate decode tok/s of ``n`` concurrent streams."""
    # batched: a parallel >= 2 context even for one stream (the engine's cost at n=1)
    with InferenceContext(bundle, parallel=max(n, 2) if batched else 1) as ctx:
        streams = [open_stream(ctx, backend="mlx", max_tokens=gen, ignore_eos=True,
                               context_size=512) for _ in range(n)]
        assert all(s.session.capabilities.batched == batched for s in streams)
        vocab = streams[0].session.vocab_size
        rng = random.Random(n)
        prompts = [[rng.randrange(3, vocab) for _ in range(prompt)] for _ in range(n)]
        prefilled = threading.Barrier(n + 1)
        done: list[float] = [0.0] * n

        def work(i: int) -> None:
            stream = streams[i]
            stream.prefill(prompts[i])
            prefilled.wait()
            made = 0
            while made < gen:
                made += len(stream.next().tokens)
            done[i] = time.perf_counter()

        threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        prefilled.wait()
        start = time.perf_counter()
        for t in threads:
            t.join()
        elapsed = max(done) - start
        engine = getattr(streams[0].session, "engine", None)
        width = engine.stats.rows / max(1, engine.stats.batched_steps) if engine else 1.0
        for s in streams:
            s.close()
    return {"tok_s": n * gen / elapsed, "rows_per_forward": width}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, default=ROOT / "examples" / "bundles" / "tiny")
    ap.add_argument("--n", default="1,2,4,8")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--gen", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for n in [int(x) for x in args.n.split(",")]:
        got: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
        for r in range(args.rounds):
            for batched in ((True, False) if r % 2 == 0 else (False, True)):
                got[batched].append(run_mode(args.bundle, n, args.prompt, args.gen, batched))
        b = statistics.median(x["tok_s"] for x in got[True])
        i = statistics.median(x["tok_s"] for x in got[False])
        w = statistics.median(x["rows_per_forward"] for x in got[True])
        rows.append({"n": n, "batched_tok_s": b, "independent_tok_s": i, "ratio": b / i,
                     "rows_per_forward": w})
    load = os.getloadavg()
    if args.json:
        print(json.dumps({"bundle": str(args.bundle), "load": load, "rows": rows}, indent=1))
        return
    print(f"{args.bundle.name}: prompt {args.prompt}, gen {args.gen}, median of {args.rounds} "
          f"interleaved rounds; load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    print("| streams | batched tok/s | independent tok/s | ratio | rows / forward |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['n']} | {r['batched_tok_s']:.1f} | {r['independent_tok_s']:.1f} | "
              f"{r['ratio']:.2f}x | {r['rows_per_forward']:.2f} |")


if __name__ == "__main__":
    main()
