"""What Python work per generated token costs a decode loop, by where it runs: on the decoding
thread between two ``llama_decode`` calls (serial), or on another thread during the next decode
(overlapped, as a server's event loop or a pipelined design would run it). A bare C-level loop
of one-token decodes; the work is a pure-Python busy loop of ``--work`` microseconds per token.
The modes interleave, round by round; medians of ms per token.

    python benchmarks/python_overlap.py MODEL.gguf [--threads 2] [--rounds 7] [--work 300,600]

Measured on the 2-core development machine (SmolLM2 Q4_1, 2 threads, load average 1.3-1.9;
three runs of 7, 3 and 7 rounds, ms added to a token of 6.9-7.5): 600 us of work per token
costs +0.54 / +0.45 / +0.58 serial and +0.64 / +0.68 / +1.26 overlapped; at 300 us the runs
disagree (+0.22 / +0.10 / +1.11 serial, +0.42 / +0.11 / +0.28 overlapped). With as many
decoding threads as cores, Python that runs during a decode does not come free: llama.cpp's
OpenMP threads wait for the preempted one at every barrier. Moving per-token work off the
critical path pays only on a machine with cores to spare.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from eliza_llamacpp.bindings import lc

SKIP = 10  # the first tokens of each run (warm-up) are left out


def burn(microseconds: float) -> None:
    """Busy Python (holding the GIL) for about ``microseconds``."""
    end = time.perf_counter() + microseconds * 1e-6
    while time.perf_counter() < end:
        pass


def run(ctx: object, mode: str, work_us: float, tokens: int) -> float:
    """ms per one-token ``llama_decode`` with ``work_us`` of Python per token, ``mode``
    none / serial / overlap."""
    lc.llama_memory_clear(lc.llama_get_memory(ctx), True)
    batch = lc.llama_batch_init(1, 0, 1)
    wake, done = threading.Event(), threading.Event()

    def worker() -> None:
        while True:
            wake.wait()
            wake.clear()
            if done.is_set():
                return
            burn(work_us)

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    start = 0.0
    for k in range(tokens):
        if k == SKIP:
            start = time.perf_counter()
        batch.token[0], batch.pos[0], batch.n_seq_id[0] = 1000 + k, k, 1
        batch.seq_id[0][0], batch.logits[0], batch.n_tokens = 0, 1, 1
        lc.llama_decode(ctx, batch)
        if mode == "serial":
            burn(work_us)
        elif mode == "overlap":
            wake.set()
    per_token = (time.perf_counter() - start) / (tokens - SKIP) * 1e3
    done.set()
    wake.set()
    thread.join()
    lc.llama_batch_free(batch)
    return per_token


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=150)
    ap.add_argument("--work", default="300,600", help="microseconds per token, comma-separated")
    args = ap.parse_args()
    model = lc.llama_model_load_from_file(args.model.encode(), lc.llama_model_default_params())
    params = lc.llama_context_default_params()
    params.n_ctx, params.n_threads, params.n_threads_batch = 512, args.threads, args.threads
    ctx = lc.llama_init_from_model(model, params)
    cases = [("none", 0.0)] + [(mode, float(us)) for us in args.work.split(",")
                               for mode in ("serial", "overlap")]
    results: dict[tuple[str, float], list[float]] = {case: [] for case in cases}
    for _ in range(args.rounds):
        for mode, us in cases:
            results[(mode, us)].append(run(ctx, mode, us, args.tokens))
    base = statistics.median(results[("none", 0.0)])
    for (mode, us), values in results.items():
        median = statistics.median(values)
        print(f"{mode:8s} {us:5.0f} us/token: {median:.3f} ms/token ({median - base:+.3f})")
    lc.llama_free(ctx)
    lc.llama_model_free(model)


if __name__ == "__main__":
    main()
