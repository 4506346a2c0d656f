"""Continuous batching in process: N concurrent streams on one ``parallel=N`` context vs N
independent sessions (each its own ``llama_context``), side by side in one run.

    python benchmarks/bench_batching.py [--gguf PATH] [--n 1,2,4,8] [--prompt 128] [--gen 64]
                                        [--threads 2] [--rounds 2] [--json]

Each stream runs on its own thread (as the server gives each request a worker): prefill of a
``--prompt``-token prompt (a different one per stream), then ``next()`` one token at a time,
greedy, ``--gen`` tokens. Aggregate decode tok/s = N * gen / (the time from the moment every
stream finished its prefill to the last stream's last token). The modes run interleaved per
round (the order rotates) so machine noise hits both; the table shows the median over rounds
and the batched/independent ratio. For the batched mode it also prints what the step scheduler
saw: mean sequences per step, steps where the gather window ran out, and the resubmit lag
(a sequence's decode share finishing -> its next one arriving: what
:data:`~eliza_backends.runtime.batching.GATHER_WINDOW_S` must cover), p50/p90/p99/max.

On a machine shared with other work, wall-clock throughput favours the mode with more threads
(N independent contexts run 2N llama.cpp threads against the other load, the batched context
2), so the table also gives tokens per CPU-second of this process (every thread, llama.cpp's
spinning workers included): what the batching saves, nearly independent of the load.

Default model: SmolLM2-135M-Instruct Q4_1 from the real-model cache (``tests/real/models.py``),
else ``benchmarks/real_models.py``'s search. Say the load (``uptime``) next to the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from eliza_backends import InferenceContext, StreamConfig

TEXT = ("The history of the lighthouse begins on a rocky coast where sailors needed a light to "
        "guide them home through storms and fog. Keepers trimmed wicks, polished lenses and "
        "wrote the weather into logbooks, night after night, for a hundred years. ")


def default_gguf() -> Path:
    cache = Path(os.environ.get("ELIZA_CACHE_DIR") or Path.home() / ".cache" / "eliza-backends")
    found = sorted(cache.glob("models/smollm2/**/*.gguf"))
    if found:
        return found[0]
    sys.path.insert(0, str(Path(__file__).parent))
    from real_models import HINT, real_ggufs

    ggufs = real_ggufs()
    if not ggufs:
        raise SystemExit(HINT)
    return ggufs[0]


def _cpu_seconds() -> float:
    """User + system CPU time of this process so far (every thread, llama.cpp's included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _open(ctx: InferenceContext, cfg: StreamConfig) -> Any:
    from eliza_llamacpp import LlamaCppFactory

    with ctx.opening():
        return LlamaCppFactory().open(ctx, cfg)


def run(gguf: Path, n: int, batched: bool, prompt_len: int, gen: int, threads: int
        ) -> dict[str, Any]:
    """One measurement: ``n`` streams, batched on one context or each on its own."""
    cfg = StreamConfig.build({"context_size": max(512, prompt_len + gen + 16), "batch_size": 512,
                              "threads": threads, "max_tokens": gen, "ignore_eos": True})
    # (one stream "batched" still goes through the shared context and its scheduler)
    with InferenceContext(gguf, parallel=max(n, 2) if batched else 1) as ctx:
        sessions = [_open(ctx, cfg) for _ in range(n)]
        unit = sessions[0].tokenize(TEXT, add_special=False)
        prompts = [(unit * (prompt_len // len(unit) + 2))[i:i + prompt_len] for i in range(n)]
        ready = threading.Barrier(n + 1)
        ends: list[float] = [0.0] * n
        tokens: list[list[int]] = [[] for _ in range(n)]
        errors: list[BaseException] = []

        def stream(i: int) -> None:
            s, got = sessions[i], tokens[i]
            try:
                s.prefill(prompts[i])
                ready.wait()
                for _ in range(gen):
                    got.extend(s.next(1).tokens)
                ends[i] = time.perf_counter()
            except BaseException as exc:
                errors.append(exc)
                ready.abort()

        workers = [threading.Thread(target=stream, args=(i,)) for i in range(n)]
        for w in workers:
            w.start()
        ready.wait()
        t0, cpu0 = time.perf_counter(), _cpu_seconds()
        for w in workers:
            w.join()
        cpu = _cpu_seconds() - cpu0  # (the last stream's end to here: a join, nothing more)
        if errors:
            raise errors[0]
        out: dict[str, Any] = {"tok_s": n * gen / (max(ends) - t0), "tok_cpu_s": n * gen / cpu,
                               "tokens": tokens}
        sched = sessions[0].scheduler
        if sched is not None:
            stats = sched.stats()
            lags = sorted(stats.resubmit_lags)
            out.update(mean_batch=stats.mean_batch, steps=stats.steps,
                       waited_out=stats.waited_out,
                       lag_ms={q: 1e3 * lags[min(len(lags) - 1, int(q / 100 * len(lags)))]
                               for q in (50, 90, 99, 100)} if lags else {})
        for s in sessions:
            s.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", type=Path, default=None)
    ap.add_argument("--n", default="1,2,4,8")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    gguf = args.gguf or default_gguf()
    ns = [int(x) for x in args.n.split(",")]
    results: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for r in range(args.rounds):
        for n in ns:
            modes = ["batched", "independent"][::(-1) ** r]
            for mode in modes:
                res = run(gguf, n, mode == "batched", args.prompt, args.gen, args.threads)
                results.setdefault((n, mode), []).append(res)
                print(f"round {r} n={n} {mode}: {res['tok_s']:.1f} tok/s", file=sys.stderr)
    if args.json:
        print(json.dumps({f"{n}/{m}": [{k: x for k, x in r.items() if k != "tokens"}
                                       for r in v] for (n, m), v in results.items()}, indent=1))
        return
    print(f"{gguf.name}, prompt {args.prompt}, gen {args.gen}, threads {args.threads}, "
          f"{args.rounds} rounds (median); load: {os.getloadavg()[0]:.2f}")
    print("| streams | batched tok/s | independent tok/s | ratio | tokens per CPU-second, "
          "batched / independent | mean batch | window ran out | resubmit lag p50/p90/p99/max "
          "ms | greedy tokens equal |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in ns:
        agree = _agreement(results[(n, "batched")], results[(n, "independent")])
        b = statistics.median(x["tok_s"] for x in results[(n, "batched")])
        i = statistics.median(x["tok_s"] for x in results[(n, "independent")])
        bc = statistics.median(x["tok_cpu_s"] for x in results[(n, "batched")])
        ic = statistics.median(x["tok_cpu_s"] for x in results[(n, "independent")])
        last = results[(n, "batched")][-1]
        lag = "/".join(f"{v:.2f}" for v in last.get("lag_ms", {}).values()) or "-"
        mean = f"{last['mean_batch']:.2f}" if "mean_batch" in last else "-"
        waited = f"{last['waited_out']}/{last['steps']}" if "steps" in last else "-"
        print(f"| {n} | {b:.1f} | {i:.1f} | {b / i:.2f}x | {bc:.1f} / {ic:.1f} ({bc / ic:.2f}x) "
              f"| {mean} | {waited} | {lag} | {agree} |")


def _agreement(batched: list[dict[str, Any]], alone: list[dict[str, Any]]) -> str:
    """How many of the batched streams' tokens equal the same stream's on its own context
    (every round), and the earliest divergence."""
    same = total = 0
    first: int | None = None
    for b, a in zip(batched, alone, strict=True):
        for tb, ta in zip(b["tokens"], a["tokens"], strict=True):
            total += 1
            if tb == ta:
                same += 1
                continue
            at = next(k for k, (x, y) in enumerate(zip(tb, ta, strict=False)) if x != y)
            first = at if first is None else min(first, at)
    return f"{same}/{total}" + (f" (first divergence at token {first})" if first is not None
                                else "")


if __name__ == "__main__":
    main()
