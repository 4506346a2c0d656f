"""Decode speed when llama.cpp contexts decode on more than one thread of a process (found in
issue 39's work, not fixed): a lone context's stream decodes on the calling thread, a batched
context's on its engine's own thread, and each such thread gets its own OpenMP team. Once
libgomp manages more threads than the process has CPUs it stops spinning at barriers (its
throttled spin count) and sleeps at each of the graph's barriers instead.

    python benchmarks/openmp_teams.py MODEL.gguf [--threads 2]

Prints ms per token of a 64-token greedy stream on a lone context and on a ``parallel=8``
context, in the order lone, batched, batched, lone, with each busy thread's CPU ticks and
affinity. Measured 2026-12-03 (SmolLM2 Q4_1, 2 threads, 2 cores): lone 6.5-7.9 ms, then batched
13.8-18.4 (2x), then lone again 7.0-8.9; the batched context first (before any lone decode):
6.8, as the lone one. ``OMP_WAIT_POLICY=passive`` gives 25-27 ms everywhere (the barrier
sleeps), ``active`` 26-29 for the batched one. The fix this points at: every ``llama_decode``
of a process on one thread (as eliza_mlx keeps one mlx thread).
"""

from __future__ import annotations

import argparse
import os
import time

from eliza_backends import InferenceContext, open_stream

PROMPT = "Tell me about the sea."


def thread_ticks() -> dict[str, tuple[str, int]]:
    """Each thread of this process: (name, user + system clock ticks)."""
    out: dict[str, tuple[str, int]] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            with open(f"/proc/self/task/{tid}/comm") as comm:
                name = comm.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        out[tid] = (name, int(fields[11]) + int(fields[12]))
    return out


def affinity(tid: str) -> str:
    """The thread's allowed CPUs ("?" when it ended)."""
    try:
        with open(f"/proc/self/task/{tid}/status") as status:
            for line in status:
                if line.startswith("Cpus_allowed_list"):
                    return line.split()[1]
    except OSError:
        pass
    return "?"


def run(model: str, parallel: int, threads: int) -> None:
    """One 64-token stream on a fresh context of ``parallel`` sequences; prints its speed."""
    config = {"backend": "llama.cpp", "max_tokens": 64, "ignore_eos": True, "threads": threads,
              "context_size": 512}
    with InferenceContext(model, parallel=parallel) as ctx, open_stream(ctx, **config) as s:
        s.prefill(PROMPT)
        before, t0 = thread_ticks(), time.perf_counter()
        n = sum(1 for _ in s)
        wall, after = time.perf_counter() - t0, thread_ticks()
    print(f"parallel {parallel}: {wall * 1e3 / n:.2f} ms/token ({n} tokens)")
    for tid, (name, ticks) in sorted(after.items()):
        used = ticks - before.get(tid, (name, 0))[1]
        if used:
            print(f"    thread {tid} {name}: {used} ticks, CPUs {affinity(tid)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    for parallel in (1, 8, 8, 1):
        run(args.model, parallel, args.threads)


if __name__ == "__main__":
    main()
